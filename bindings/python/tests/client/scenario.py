"""The cross-language conformance scenario, Python side: every case against a real
`ferry serve --api conformance`, through the generated client (`ferry.generated`) on the
native `ferry.Client` (`sdk::*` rows of `cargo xtask conformance`, column `python-sdk`).

`CASES` lists `(name, function)`; each function gets a `Ctx` and raises on failure. The
names are the rows of `cargo xtask conformance`'s table (column `python-sdk`). The
pattern and checksum are those the conformance API documents (`make`, `inspect`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

import ferry
from ferry import CallTimeout, ConnectionClosed, RpcError, Tensor, _native
from ferry.generated import conformance as api
from ferry.generated.conformance import AsyncConformanceClient, ConformanceClient


@dataclass
class Ctx:
    """What a case gets: the shared server's address, and a way to start its own."""

    addr: str
    start_server: Callable[[], Any]
    """Starts a server of the case's own (it has `.addr` and `.kill()`)."""


def pattern(dtype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    """The conformance API's `make` tensor, computed locally."""
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(n, dtype=np.int64)
    r = i % 251
    if dtype == "bool":
        out: npt.NDArray[Any] = i % 3 == 0
    elif dtype in ("u8", "u16", "u32", "u64"):
        out = r.astype(ferry.NUMPY_DTYPES[dtype])
    elif dtype in ("i8", "i16", "i32", "i64"):
        out = (r - 125).astype(ferry.NUMPY_DTYPES[dtype])
    elif dtype == "bf16":
        bits = ferry.f32_to_bf16((r - 125).astype(np.float32) * 0.5)
        out = bits.view(ferry.NUMPY_DTYPES["bf16"])  # ml_dtypes' bfloat16, as received
    else:
        out = ((r - 125).astype(np.float64) * 0.5).astype(ferry.NUMPY_DTYPES[dtype])
    return out.reshape(shape)


def checksum(a: npt.NDArray[Any]) -> str:
    """sum(b_j * (j % 251 + 1)) mod 2**64 over the array's bytes (row-major)."""
    b = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    total = 0
    step = 251 * 4096
    weights = (np.arange(step, dtype=np.uint64) % 251) + 1
    for start in range(0, len(b), step):
        chunk = b[start : start + step].astype(np.uint64)
        total += int((chunk * weights[: len(chunk)]).sum(dtype=np.uint64))
    return str(total % 2**64)


def same(a: npt.NDArray[Any], b: npt.NDArray[Any], what: str) -> None:
    """Equal dtype (bf16 tag included), shape and bytes."""
    assert a.dtype == b.dtype and a.dtype.metadata == b.dtype.metadata, (
        f"{what}: dtype {a.dtype} != {b.dtype}"
    )
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert np.array_equal(
        a.view(np.uint8) if a.ndim and a.size else a,
        b.view(np.uint8) if b.ndim and b.size else b,
    ), what


def _base(a: npt.NDArray[Any]) -> object:
    """What an array views (numpy's stubs think it can only be an array or None)."""
    return a.base


def client(ctx: Ctx, shm: bool = True) -> ConformanceClient:
    return ConformanceClient.connect(ctx.addr, timeout=30.0, shm=shm)


# ---- handshake ----------------------------------------------------------------------


def shm_negotiated(ctx: Ctx) -> None:
    with client(ctx) as c:
        assert c.client.channel == "shm", c.client.channel
        who = c.whoami()
        assert who["channel"] == "shm" and who["kind"] == "pipe", who


def inline_only(ctx: Ctx) -> None:
    with client(ctx, shm=False) as c:
        assert c.client.channel == "inline"
        assert c.whoami()["channel"] == "inline"
        t = c.make("f32", [64, 64])
        same(t, pattern("f32", (64, 64)), "inline make")
        assert c.inspect(t)["checksum"] == checksum(t)


# ---- data ---------------------------------------------------------------------------


def dtype_case(dtype: str) -> Callable[[Ctx], None]:
    """Every way a tensor of `dtype` travels: made by the server, echoed back, sent from
    here (checksummed by the server), over shm and inline, small (inline-sized) and
    larger (shm-sized)."""

    def case(ctx: Ctx) -> None:
        for shm in (True, False):
            with client(ctx, shm=shm) as c:
                for shape in ((3, 5), (64, 128)):
                    want = pattern(dtype, shape)
                    got = c.make(cast(api.DType, dtype), list(shape))
                    same(got, want, f"make {dtype}{shape} shm={shm}")
                    same(c.echo(got), want, f"echo {dtype}{shape} shm={shm}")
                    sent = want.copy()
                    info = c.inspect(sent)
                    assert info["dtype"] == dtype, info
                    assert info["shape"] == list(shape), info
                    assert info["checksum"] == checksum(sent), (dtype, shape, info)
                    same(c.echo(sent), want, f"echo local {dtype}{shape} shm={shm}")
                if dtype == "bf16":  # any uint16 array, sent as bf16 through `Tensor`
                    bits = pattern("bf16", (4,)).view(np.uint16)
                    assert c.inspect(Tensor(bits, "bf16"))["dtype"] == "bf16"

    return case


def empty_tensors(ctx: Ctx) -> None:
    with client(ctx) as c:
        for dtype in ("f32", "u8", "bf16", "bool"):
            for shape in ((0,), (2, 0, 3), ()):
                got = c.make(dtype, list(shape))
                same(got, pattern(dtype, shape), f"make {dtype}{shape}")
                back = c.echo(np.zeros(shape, dtype=ferry.NUMPY_DTYPES[dtype]))
                assert back.shape == shape, (dtype, shape, back.shape)
                info = c.inspect(got)
                assert info["shape"] == list(shape), info
                assert info["nbytes"] == got.nbytes, info


def large_tensor(ctx: Ctx) -> None:
    shape = (1920, 1080, 3)
    want = pattern("f32", shape)
    with client(ctx) as c:
        got = c.make("f32", list(shape))
        same(got, want, "make large")
        assert isinstance(_base(got), _native.TensorRef), type(got.base)
        info = c.inspect(want)  # a heap array: copied into shared memory once
        assert info["checksum"] == checksum(want), info
        frame = c.client.alloc(shape, "f32")
        frame[...] = want
        back = c.echo(frame)
        assert np.shares_memory(back, frame), "an allocated tensor came back as a copy"
        same(back, want, "echo allocated large")


def zero_copy(ctx: Ctx) -> None:
    with client(ctx) as c:
        a = c.make("f32", [256, 256])
        assert not a.flags.writeable, "a view of the server's memory must be read-only"
        base = _base(a)
        assert isinstance(base, _native.TensorRef), type(base)
        # The array is the received tensor's bytes, where the server's memory is mapped.
        assert base.data_ptr == int(a.__array_interface__["data"][0])
        assert base.nbytes == a.nbytes
        view = a[10:20]
        assert np.shares_memory(view, a)
        back = c.echo(a)  # the server's own memory goes back and returns: no copy
        assert np.shares_memory(back, a)
        mine = c.client.alloc((128, 128), "u16")
        mine[...] = 7
        assert np.shares_memory(c.echo(mine), mine)
        # (That leases go back once the arrays are gone is the Rust core's to test:
        # ferry-shm's conformance cases and tests/give_back.rs.)


def named_map_result(ctx: Ctx) -> None:
    names = ["fc1.weight", "fc1.bias", "layers/0/w", "ünïcode"]
    with client(ctx) as c:
        m = c.make_map(names, "bf16", [32, 16])
        assert sorted(m) == sorted(names), sorted(m)
        for t in m.values():
            same(t, pattern("bf16", (32, 16)), "make_map")
        back = c.echo_map(m)
        assert sorted(back) == sorted(names)


def named_map_params(ctx: Ctx) -> None:
    with client(ctx) as c:
        local = {
            "w": pattern("i64", (100, 100)),
            "b": pattern("f16", (7,)),
            "e": pattern("u8", (0,)),
        }
        infos = c.inspect_map(local)
        for k, v in local.items():
            assert infos[k]["checksum"] == checksum(v), (k, infos[k])
        assert c.echo_map({}) == {}


def nested_values(ctx: Ctx) -> None:
    with client(ctx) as c:
        big = pattern("f32", (300, 300))
        value: api.Nested = {
            "name": "n",
            "list": [pattern("i32", (3,)), big],
            "map": {"a": pattern("u8", (5,))},
            "maybe": None,
        }
        back = c.echo_nested(value)
        assert back["name"] == "n" and back.get("maybe") is None
        same(back["list"][1], big, "nested list")
        same(back["map"]["a"], pattern("u8", (5,)), "nested map")
        value["maybe"] = pattern("f64", (2, 2))
        got = c.echo_nested(value).get("maybe")
        assert got is not None
        same(got, pattern("f64", (2, 2)), "nested maybe")


def types_roundtrip(ctx: Ctx) -> None:
    with client(ctx) as c:
        child: api.Shapes = {
            "points": [],
            "color": "blue",
            "counts": {},
            "pair": [-1, ""],
            "flag": False,
            "big": -(2**53) + 1,
            "child": None,
        }
        value: api.Shapes = {
            "points": [
                {"x": 1.5, "y": -2.0, "label": "ä ß 東京"},
                {"x": 0.0, "y": 1e300},
            ],
            "color": "red",
            "counts": {"a": 1, "b": 4294967295},
            "pair": [2**53 - 1, "two"],
            "flag": True,
            "big": 2**53 - 1,
            "child": child,
        }
        back = c.roundtrip(value)
        assert back == value, back


# ---- rpc ----------------------------------------------------------------------------


def batch(ctx: Ctx) -> None:
    with client(ctx) as c:
        x = pattern("f32", (100, 100))
        results = c.client.batch(
            [
                ("make", {"dtype": "u8", "shape": [4]}),
                ("fail", {"code": 42, "message": "no"}),
                ("inspect", {"tensor": x}),
                ("echo", {"tensor": x}),
                ("nope", None),
            ]
        )
        same(results[0], pattern("u8", (4,)), "batch make")
        assert isinstance(results[1], RpcError) and results[1].code == 42, results[1]
        assert results[2]["checksum"] == checksum(x), results[2]
        same(results[3], x, "batch echo")
        assert isinstance(results[4], RpcError) and results[4].code == -32601, results[4]


def notifications(ctx: Ctx) -> None:
    with client(ctx) as c:
        c.client.notify("fail", {"code": 1, "message": "never answered"})
        c.client.notify("echo", {"tensor": pattern("f32", (1000,))})
        assert c.whoami()["kind"] == "pipe"


# ---- errors -------------------------------------------------------------------------


def error_table(ctx: Ctx) -> None:
    with client(ctx) as c:
        doc = c.client.discover()
        table = doc["x-ferry-errors"]
        assert len(table) == len(api.ERRORS), (table, api.ERRORS)
        for row in table:
            cls = api.ERRORS[row["code"]]
            try:
                c.fail(row["code"], row["message"], data={"row": row["name"]})
            except RpcError as e:
                assert type(e) is cls, (row, type(e))
                assert e.code == row["code"] and e.message == row["message"], e
                assert e.data == {"row": row["name"]}, e.data
            else:
                raise AssertionError(f"{row} did not fail")
        try:
            c.fail(4242, "application error")
        except RpcError as e:
            assert type(e) is RpcError and e.code == 4242, e


def error_invalid_params(ctx: Ctx) -> None:
    with client(ctx) as c:
        try:
            c.client.call("make", {"dtype": "f33", "shape": [1]})
        except RpcError as e:
            # The raw client raises the runtime's class of the code, the same class the
            # generated client raises (it re-exports it).
            assert type(e) is ferry.InvalidParamsError, type(e)
            assert api.InvalidParamsError is ferry.InvalidParamsError
            assert e.code == -32602
        else:
            raise AssertionError("no error")
        try:
            c.make("f33", [1])  # type: ignore[arg-type]
        except api.InvalidParamsError as e:
            assert isinstance(e.data, dict) and e.data.get("path") == "dtype", e.data
        else:
            raise AssertionError("no error")


def error_method_not_found(ctx: Ctx) -> None:
    with client(ctx) as c:
        try:
            c.client.call("no_such_method")
        except RpcError as e:
            assert e.code == -32601
        else:
            raise AssertionError("no error")


def timeouts(ctx: Ctx) -> None:
    with client(ctx) as c:
        # A timeout not kept would end in the answer (10 s later), not CallTimeout.
        try:
            c.slow(10_000, timeout=0.3)
        except CallTimeout:
            pass
        else:
            raise AssertionError("no CallTimeout")
        # The connection is fine, and the late answer (if any) is not mistaken for another.
        assert c.slow(1) == 1
        same(c.make("u8", [3]), pattern("u8", (3,)), "after a timeout")


def server_gone_mid_call(ctx: Ctx) -> None:
    server = ctx.start_server()
    try:
        c = ConformanceClient.connect(server.addr, timeout=60.0)
        held = c.make("f32", [1024, 1024])  # keeps a mapping of the dying server's memory
        errors: list[BaseException] = []

        def call() -> None:
            try:
                c.slow(60_000)
            except BaseException as e:
                errors.append(e)

        th = threading.Thread(target=call)
        th.start()
        time.sleep(0.2)
        server.kill()
        th.join(timeout=30)
        assert not th.is_alive(), "the call hangs after the server died"
        assert len(errors) == 1 and isinstance(errors[0], ConnectionClosed), errors
        try:
            c.whoami()
        except ConnectionClosed:
            pass
        else:
            raise AssertionError("a call after the server died did not fail")
        same(held, pattern("f32", (1024, 1024)), "memory of a dead server")
        c.close()
    finally:
        server.kill()


def tasks(ctx: Ctx) -> None:
    with client(ctx) as c:
        task = c.client.submit("slow", {"ms": 300})
        assert c.client.task_status(task)["state"] == "running"
        assert c.client.task_result(task, wait_ms=10_000) == 300
        try:
            c.client.task_result(task)
        except RpcError as e:  # the runtime's own methods raise RpcError itself
            assert e.code == api.TaskNotFoundError.CODE, e
        else:
            raise AssertionError("a task result was fetched twice")
        long = c.client.submit("slow", {"ms": 60_000})
        assert c.client.task_cancel(long)["state"] == "cancelled"
        try:
            c.client.task_result(long, wait_ms=1000)
        except RpcError as e:
            assert e.code in (api.CancelledError.CODE, api.TaskNotFoundError.CODE), e
        task = c.client.submit("make", {"dtype": "i16", "shape": [10, 10]})
        same(
            c.client.task_result(task, wait_ms=10_000),
            pattern("i16", (10, 10)),
            "task make",
        )


# ---- asyncio ------------------------------------------------------------------------


def asyncio_concurrent(ctx: Ctx) -> None:
    async def main() -> None:
        async with await AsyncConformanceClient.connect(ctx.addr) as c:
            assert c.client.channel == "shm"
            shapes = [(i + 1, 100) for i in range(16)]
            results = await asyncio.gather(*(c.make("i32", list(s)) for s in shapes))
            for s, r in zip(shapes, results, strict=True):
                same(r, pattern("i32", s), "async make")
            echoes = await asyncio.gather(*(c.echo(r) for r in results))
            for s, r in zip(shapes, echoes, strict=True):
                same(r, pattern("i32", s), "async echo")
            try:
                await c.slow(10_000, timeout=0.2)
            except CallTimeout:
                pass
            else:
                raise AssertionError("no CallTimeout")
            with contextlib.suppress(api.TaskPendingError):
                await c.fail(-32005, "pending")
            batch = await c.client.batch(
                [("slow", {"ms": 1}), ("fail", {"code": 9, "message": "x"})]
            )
            assert batch[0] == 1 and isinstance(batch[1], RpcError)

    asyncio.run(main())


def asyncio_server_gone(ctx: Ctx) -> None:
    server = ctx.start_server()

    async def main() -> None:
        c = await AsyncConformanceClient.connect(server.addr)
        pending = asyncio.ensure_future(c.slow(60_000))
        await asyncio.sleep(0.2)
        server.kill()
        try:
            # A hang guard: the call would run 60 s with a living server.
            await asyncio.wait_for(pending, 30)
        except ConnectionClosed:
            pass
        else:
            raise AssertionError("no ConnectionClosed")
        await c.close()

    try:
        asyncio.run(main())
    finally:
        server.kill()


CASES: list[tuple[str, Callable[[Ctx], None]]] = [
    ("sdk::shm_negotiated", shm_negotiated),
    ("sdk::inline_only", inline_only),
    *[(f"sdk::dtype_{d}", dtype_case(d)) for d in ferry.DTYPES],
    ("sdk::empty_tensors", empty_tensors),
    ("sdk::large_tensor", large_tensor),
    ("sdk::zero_copy", zero_copy),
    ("sdk::named_map_result", named_map_result),
    ("sdk::named_map_params", named_map_params),
    ("sdk::nested_values", nested_values),
    ("sdk::types_roundtrip", types_roundtrip),
    ("sdk::batch", batch),
    ("sdk::notifications", notifications),
    ("sdk::error_table", error_table),
    ("sdk::error_method_not_found", error_method_not_found),
    ("sdk::error_invalid_params", error_invalid_params),
    ("sdk::many_in_flight", asyncio_concurrent),
    ("sdk::call_timeout", timeouts),
    ("sdk::tasks", tasks),
    ("sdk::server_gone_mid_call", server_gone_mid_call),
    ("sdk::asyncio_server_gone", asyncio_server_gone),
]
"""Every case, in the order the table lists them. Rows shared with the TypeScript SDK's
scenario have its names (`sdk::dtype_f32`, `sdk::batch`, ...), so the table lines them up."""
