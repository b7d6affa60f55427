"""`ferry.Client`, `AsyncClient` and the generated clients against real `ferry serve`
processes (and a socket that is not a ferry server). The wire itself (frames, handshake,
hostile peers, limits) is the Rust core's to test: core's frame and handshake tests,
conformance/vectors, rpc's peer-input tests."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from ferry import (
    AsyncClient,
    CallTimeout,
    Client,
    ConnectionClosed,
    FerryError,
    RpcError,
    Tensor,
    _native,
    bf16_to_f32,
    f32_to_bf16,
)
from ferry.generated.demo import (
    AsyncDemoClient,
    DemoClient,
    InvalidParamsError,
    TaskNotFoundError,
    TaskPendingError,
)
from tests.client.servers import FakeServer, Server


def _base(a: npt.NDArray[Any]) -> object:
    """The received tensor (`_native.TensorRef`) an array views, else its base."""
    base: object = a.base
    while base is not None and not isinstance(base, _native.TensorRef):
        base = getattr(base, "base", None)
    return base if base is not None else a.base


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def test_demo_through_the_generated_client(demo: Server) -> None:
    with DemoClient.connect(demo.addr) as c:
        assert c.add(1, 2) == 3.0
        assert c.sum(np.arange(10, dtype=np.int16)) == 45.0
        m = c.matmul(np.eye(3, dtype=np.float32), np.full((3, 2), 2.0, dtype=np.float32))
        assert m.tolist() == [[2.0, 2.0]] * 3
        w = c.weights()
        assert sorted(w) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
        d = c.describe(w)
        assert d["fc1.weight"]["shape"] == [4, 8] and d["fc1.weight"]["dtype"] == "f32"
        with pytest.raises(InvalidParamsError) as e:
            c.matmul(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))
        assert isinstance(e.value.data, dict) and e.value.data["path"] == "b"
        assert c.whoami()["channel"] == "shm"


def test_received_memory_is_not_copied(demo: Server) -> None:
    """A 256 MiB tensor from the server costs this process no private memory: the array
    views the server's mapped segment."""
    with Client.connect(demo.addr) as c:
        anon0, shmem0 = status_kb("RssAnon"), status_kb("RssShmem")
        t = c.call("create_tensor", {"shape": [256 << 20], "dtype": "u8", "fill": 1})
        assert isinstance(_base(t), _native.TensorRef) and not t.flags.writeable
        assert int(t.sum(dtype=np.uint64)) == 256 << 20  # touches every page
        anon1, shmem1 = status_kb("RssAnon"), status_kb("RssShmem")
        assert anon1 - anon0 < 32 << 10, (anon0, anon1)
        assert shmem1 - shmem0 > 200 << 10, (shmem0, shmem1)
        other = c.call("create_tensor", {"shape": [16], "dtype": "u8"})
        assert isinstance(_base(other), _native.TensorRef)


def test_sending_allocated_memory_is_not_copied(demo: Server) -> None:
    with Client.connect(demo.addr) as c:
        for _ in range(30):
            frame_ = c.alloc((1920, 1080, 3), "f32")
            frame_[...] = 0.25
            back = c.call("echo", {"tensor": frame_})
            assert np.shares_memory(back, frame_) and back[0, 0, 0] == 0.25
            del frame_, back


def test_copy_in_and_inline(demo: Server) -> None:
    x = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)
    for shm in (True, False):
        with Client.connect(demo.addr, shm=shm) as c:
            assert c.channel == ("shm" if shm else "inline")
            back = c.call("echo", {"tensor": x})
            assert np.array_equal(back, x) and not np.shares_memory(back, x)
            strided = x[::2, ::3]  # not contiguous: copied once
            assert np.array_equal(c.call("echo", {"tensor": strided}), strided)
            big = np.ones((1920, 1080, 3), np.float32)
            assert c.call("sum", {"tensor": big}) == big.size


def test_bf16_and_f16(demo: Server) -> None:
    with Client.connect(demo.addr) as c:
        b = c.call("create_tensor", {"shape": [4], "dtype": "bf16", "fill": 1.5})
        assert b.dtype == np.dtype(ml_dtypes.bfloat16), b.dtype  # ml_dtypes' bfloat16
        assert bf16_to_f32(b.view(np.uint16)).tolist() == [1.5] * 4
        assert c.call("sum", {"tensor": b}) == 6.0  # goes back as bf16
        assert c.call("sum", {"tensor": Tensor(np.array([0x3FC0] * 2, np.uint16), "bf16")}) == 3.0
        h = c.call("create_tensor", {"shape": [3], "dtype": "f16", "fill": 0.5})
        assert h.dtype == np.float16 and h.tolist() == [0.5] * 3
    vals = np.array([1.0, -2.5, 3.14159, 65504.0, np.inf, np.nan, 1.00390625], np.float32)
    back = bf16_to_f32(f32_to_bf16(vals))
    assert back[0] == 1.0 and back[1] == -2.5 and abs(back[2] - 3.14159) < 0.02
    assert np.isinf(back[4]) and np.isnan(back[5])
    assert back[6] == 1.0  # a tie rounds to even


def test_dlpack(demo: Server) -> None:
    with Client.connect(demo.addr) as c:
        t = c.call("create_tensor", {"shape": [8, 8], "dtype": "f32", "fill": 3})
        wrapped = Tensor(t)
        assert wrapped.__dlpack_device__() == (1, 0)
        viewed = np.from_dlpack(wrapped)  # numpy asks for DLPack 1.0: no copy
        assert np.shares_memory(viewed, t) and not viewed.flags.writeable
        capsule = wrapped.__dlpack__()  # an old consumer: read-only memory is copied
        assert type(capsule).__name__ == "PyCapsule"
        with pytest.raises(BufferError):
            wrapped.__dlpack__(copy=False)
        writable = c.alloc((4,), "i64")
        assert np.shares_memory(np.from_dlpack(Tensor(writable)), writable)


def test_threads_share_a_client(demo: Server) -> None:
    with Client.connect(demo.addr) as c:
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                for i in range(40):
                    x = np.full((k + 1, 64), i, dtype=np.int32)
                    assert np.array_equal(c.call("echo", {"tensor": x}), x)
                    assert c.call("add", [k, i]) == k + i
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not errors, errors


def test_timeouts_cancel_on_the_server(demo: Server) -> None:
    with Client.connect(demo.addr, timeout=0.3) as c:
        # A timeout not kept would end in the answer (5 s later), not CallTimeout.
        with pytest.raises(CallTimeout):
            c.call("sleep", {"ms": 5000})
        assert c.call("add", [1, 1], timeout=5) == 2.0
        task = c.submit("sleep", {"ms": 200})
        assert c.task_result(task, wait_ms=5000) == 200


def test_generated_task_helpers_run_a_task(demo: Server) -> None:
    """`sleep` is a task method of the demo API (`x-ferry-task`): the generated client's
    `sleep_submit`, `sleep_status` and `sleep_result` start it on `ferry serve demo`, see
    it run, refuse its result while it runs, and fetch the result, checked, once done."""
    with DemoClient.connect(demo.addr, timeout=30) as c:
        slow = c.sleep_submit(60_000)
        status = c.sleep_status(slow)
        assert status["task"] == slow and status["method"] == "sleep", status
        assert status["state"] == "running", status
        with pytest.raises(TaskPendingError):
            c.sleep_result(slow)
        quick = c.sleep_submit(20, keep=True)
        assert c.sleep_result(quick, wait=20) == 20
        assert c.sleep_status(quick)["state"] == "done"
        assert c.sleep_result(quick) == 20  # kept by the submit
        once = c.sleep_submit(0)
        assert c.sleep_result(once, wait=20) == 0
        with pytest.raises(TaskNotFoundError):  # fetched once, not kept
            c.sleep_status(once)


def test_generated_task_helpers_run_a_task_async(demo: Server) -> None:
    async def main() -> None:
        async with await AsyncDemoClient.connect(demo.addr, timeout=30) as c:
            slow = await c.sleep_submit(60_000)
            assert (await c.sleep_status(slow))["state"] == "running"
            with pytest.raises(TaskPendingError):
                await c.sleep_result(slow)
            quick = await c.sleep_submit(20)
            assert await c.sleep_result(quick, wait=20) == 20

    asyncio.run(main())


def test_tasks_end_with_their_connection_unless_detached(demo: Server) -> None:
    with Client.connect(demo.addr, timeout=10) as a:
        gone = a.submit("sleep", {"ms": 60_000})
        kept = a.submit("sleep", {"ms": 50}, detached=True)
        assert len(kept) == 33 and kept.startswith("t"), kept
    with Client.connect(demo.addr, timeout=10) as b:
        assert b.task_result(kept, wait_ms=5000) == 50
        for _ in range(200):
            try:
                b.task_status(gone)
            except RpcError as e:
                assert e.code == -32004, e
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the task of a closed connection is still there")


def test_asyncio_client(demo: Server) -> None:
    async def main() -> None:
        async with await AsyncDemoClient.connect(demo.addr) as c:
            sums = await asyncio.gather(*(c.sum(np.full(100, i, np.float64)) for i in range(20)))
            assert sums == [100.0 * i for i in range(20)]
            t = await c.create_tensor([1920, 1080, 3], "f32", fill=2.0)
            assert isinstance(_base(t), _native.TensorRef)
            back = await c.echo(t)
            assert np.shares_memory(back, t)
            slow = asyncio.ensure_future(c.sleep(10_000))
            await asyncio.sleep(0.05)
            slow.cancel()  # cancels the call on the server too
            with pytest.raises(asyncio.CancelledError):
                await slow
            assert await c.add(1, 1) == 2.0
        raw = await AsyncClient.connect(demo.addr, shm=False)
        assert raw.channel == "inline"
        assert (await raw.call("echo", {"tensor": np.arange(5)})).tolist() == list(range(5))
        await raw.close()
        with pytest.raises(ConnectionClosed):
            await raw.call("add", [1, 2])

    asyncio.run(main())


def test_asyncio_cancelled_and_timed_out_calls_print_nothing(
    demo: Server, capfd: pytest.CaptureFixture[str]
) -> None:
    """A call whose task is cancelled, or that times out, single or in a batch, leaves
    asyncio nothing to report (it printed "_GatheringFuture exception was never
    retrieved" for each, when the client gathered the answers)."""
    reports: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reports.append(context))
        async with await AsyncClient.connect(demo.addr, timeout=10) as c:
            slow: list[tuple[str, object]] = [("sleep", {"ms": 10_000})] * 2
            for call in (c.call("sleep", {"ms": 10_000}), c.batch(slow)):
                task = asyncio.ensure_future(call)
                await asyncio.sleep(0.05)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            with pytest.raises(CallTimeout):
                await c.call("sleep", {"ms": 10_000}, timeout=0.05)
            with pytest.raises(CallTimeout):
                await c.batch(slow, timeout=0.05)
            assert await c.call("add", [1, 1]) == 2.0
            # The futures of those calls are garbage now: collecting them reports nothing.
            gc.collect()
            await asyncio.sleep(0.01)

    asyncio.run(main())
    gc.collect()
    assert reports == []
    err = capfd.readouterr().err
    assert "never retrieved" not in err, err


def test_not_a_ferry_server(fake: Callable[..., FakeServer]) -> None:
    s = fake(lambda conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    with pytest.raises(FerryError) as e:
        Client.connect(s.addr)
    assert s.addr in str(e.value), "the error names the address"


def test_server_gone(own_server: Server) -> None:
    c = Client.connect(own_server.addr)
    assert c.call("slow", {"ms": 1}) == 1
    own_server.kill()
    with pytest.raises(ConnectionClosed):
        c.call("slow", {"ms": 1})
    assert c.closed
    c.close()
