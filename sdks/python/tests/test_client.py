"""The clients against real `ferry serve` processes, and against hostile fake servers
on real sockets."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from conftest import FakeServer, Server, handshake, read_request

import ferry_client
from ferry_client import (
    BF16,
    AsyncClient,
    CallTimeout,
    Client,
    ConnectionClosed,
    LimitError,
    ProtocolError,
    Refused,
    RpcError,
    Tensor,
    bf16_to_f32,
    f32_to_bf16,
)
from ferry_client import _shm
from ferry_client._wire import CLOSE, MESSAGE, PREAMBLE, WELCOME, frame
from ferry_client.generated.demo import (
    AsyncDemoClient,
    DemoClient,
    InvalidParamsError,
    TaskNotFoundError,
    TaskPendingError,
)


def _base(a: npt.NDArray[Any]) -> object:
    """What an array views (numpy's stubs think it can only be an array or None)."""
    return a.base


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
        m = c.matmul(
            np.eye(3, dtype=np.float32), np.full((3, 2), 2.0, dtype=np.float32)
        )
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
        assert isinstance(_base(t), _shm.PeerView) and not t.flags.writeable
        assert int(t.sum(dtype=np.uint64)) == 256 << 20  # touches every page
        anon1, shmem1 = status_kb("RssAnon"), status_kb("RssShmem")
        assert anon1 - anon0 < 32 << 10, (anon0, anon1)
        assert shmem1 - shmem0 > 200 << 10, (shmem0, shmem1)
        other = c.call("create_tensor", {"shape": [16], "dtype": "u8"})
        assert isinstance(_base(other), _shm.PeerView)


def test_sending_allocated_memory_is_not_copied(demo: Server) -> None:
    with Client.connect(demo.addr) as c:
        pool = c._session.pool
        assert pool is not None
        for _ in range(30):
            frame_ = c.alloc((1920, 1080, 3), "f32")
            frame_[...] = 0.25
            back = c.call("echo", {"tensor": frame_})
            assert np.shares_memory(back, frame_) and back[0, 0, 0] == 0.25
            del frame_, back
        # Slots come back: the pool did not grow with the number of calls.
        assert len(pool.segments) <= 2, [s.size for s in pool.segments]
        c.flush_releases()


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
        assert b.dtype == ferry_client.BF16 and bf16_to_f32(b).tolist() == [1.5] * 4
        assert c.call("sum", {"tensor": b}) == 6.0  # goes back as bf16
        assert (
            c.call("sum", {"tensor": Tensor(np.array([0x3FC0] * 2, np.uint16), "bf16")})
            == 3.0
        )
        h = c.call("create_tensor", {"shape": [3], "dtype": "f16", "fill": 0.5})
        assert h.dtype == np.float16 and h.tolist() == [0.5] * 3
    vals = np.array(
        [1.0, -2.5, 3.14159, 65504.0, np.inf, np.nan, 1.00390625], np.float32
    )
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


def test_limits_are_checked_before_sending(demo: Server) -> None:
    from ferry_client._wire import Limits

    with Client.connect(demo.addr, pool_limit=8 << 20) as c:
        with pytest.raises(LimitError, match="pool_limit"):
            c.alloc((16 << 20,), "u8")
        c._session.peer_limits = Limits(max_tensors=1)
        with pytest.raises(LimitError, match="max_tensors"):
            c.call("echo", {"tensor": [np.zeros(2), np.zeros(2)]})
        c._session.peer_limits = Limits(max_payload_bytes=100)
        with pytest.raises(LimitError, match="max_payload_bytes"):
            c.call("echo", {"tensor": np.zeros(1000, np.uint8)})
        c._session.peer_limits = Limits()
        assert c.call("add", [2, 3]) == 5.0  # nothing was half-sent


def test_asyncio_client(demo: Server) -> None:
    async def main() -> None:
        async with await AsyncDemoClient.connect(demo.addr) as c:
            sums = await asyncio.gather(
                *(c.sum(np.full(100, i, np.float64)) for i in range(20))
            )
            assert sums == [100.0 * i for i in range(20)]
            t = await c.create_tensor([1920, 1080, 3], "f32", fill=2.0)
            assert isinstance(_base(t), _shm.PeerView)
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
        assert (await raw.call("echo", {"tensor": np.arange(5)})).tolist() == list(
            range(5)
        )
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


# ---- hostile servers on real sockets ----------------------------------------------------


def test_not_a_ferry_server(fake: Callable[..., FakeServer]) -> None:
    s = fake(lambda conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    with pytest.raises(ProtocolError, match="not a ferry peer"):
        Client.connect(s.addr, connect_timeout=5)


def _silent(
    hang_guard: float = 60.0,
) -> tuple[Callable[[socket.socket], None], threading.Event, threading.Event]:
    """A server script that accepts, reads nothing and answers nothing until released (or
    until `hang_guard` seconds pass, a bound so a client that never times out fails the
    test with a closed connection instead of hanging it); -> (script, release, silent),
    `silent` set while the script holds the connection unanswered."""
    release, silent = threading.Event(), threading.Event()

    def script(conn: socket.socket) -> None:
        silent.set()
        release.wait(hang_guard)
        silent.clear()

    return script, release, silent


def test_silent_server_times_out(fake: Callable[..., FakeServer]) -> None:
    """The client gives up on its own, while the server still holds the connection open
    and silent, with a timeout that names connect_timeout in the caller's words."""
    script, release, silent = _silent()
    s = fake(script)
    try:
        with pytest.raises(
            CallTimeout,
            match=r"connected to .*, but it did not answer the handshake within "
            r"connect_timeout=0\.5s: is a ferry server listening there",
        ):
            Client.connect(s.addr, connect_timeout=0.5)
        assert silent.is_set(), "the server let go first: the client did not time out"
    finally:
        release.set()


def test_silent_server_times_out_async(fake: Callable[..., FakeServer]) -> None:
    script, release, silent = _silent()
    s = fake(script)

    async def main() -> None:
        await AsyncClient.connect(s.addr, connect_timeout=0.5)

    try:
        with pytest.raises(
            CallTimeout,
            match=r"connected to .*, but it did not answer the handshake within "
            r"connect_timeout=0\.5s: is a ferry server listening there",
        ):
            asyncio.run(main())
        assert silent.is_set(), "the server let go first: the client did not time out"
    finally:
        release.set()


def test_refusal(fake: Callable[..., FakeServer]) -> None:
    def refuse(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(PREAMBLE + frame(3, {"reason": "bad_token"}))

    with pytest.raises(Refused) as e:
        Client.connect(fake(refuse).addr)
    assert e.value.reason == "bad_token"


def test_unsealed_segment_closes_the_connection(
    fake: Callable[..., FakeServer],
) -> None:
    def script(conn: socket.socket) -> None:
        handshake(conn)
        read_request(conn)
        fd = os.memfd_create(
            "evil", os.MFD_CLOEXEC
        )  # no seals: could be shrunk under us
        os.ftruncate(fd, 4096)
        shm = {
            "segment": 0,
            "offset": 0,
            "len": 4,
            "lease": 1,
            "announce": {"fd": 0, "size": 4096},
        }
        body = {
            "header": {"jsonrpc": "2.0", "id": 1, "result": {"$tensor": 0}},
            "tensors": [{"meta": {"dtype": "u8", "shape": [4]}, "data": {"shm": shm}}],
        }
        data = frame(MESSAGE, body, 0, 1)
        socket.send_fds(conn, [data], [fd])
        os.close(fd)

    s = fake(script)
    c = Client.connect(s.addr)
    with pytest.raises(ProtocolError, match="SHRINK and GROW"):
        c.call("x")
    with pytest.raises(ConnectionClosed):  # the error once, then "closed"
        c.call("x")
    s.close()
    assert s.received.startswith(bytes([CLOSE])), s.received[:40]
    assert b"protocol_error" in s.received


@pytest.mark.parametrize(
    "evil",
    [
        lambda conn: conn.sendall(struct.pack("<BBHIQ", MESSAGE, 0, 0, 1 << 30, 0)),
        lambda conn: conn.sendall(
            struct.pack("<BBHIQ", MESSAGE, 0, 0, 10, 0) + b"{not json}"
        ),
        lambda conn: conn.sendall(frame(MESSAGE, {"header": [1, 2, 3]})),
        lambda conn: conn.sendall(frame(MESSAGE, {"header": {"id": 1, "error": "x"}})),
        lambda conn: conn.sendall(frame(WELCOME, {})),
        lambda conn: (
            conn.sendall(struct.pack("<BBHIQ", MESSAGE, 0, 0, 100, 0) + b"{"),
            conn.shutdown(socket.SHUT_WR),  # end of stream inside a frame
        ),
    ],
)
def test_hostile_frames(
    fake: Callable[..., FakeServer], evil: Callable[[socket.socket], None]
) -> None:
    def script(conn: socket.socket) -> None:
        handshake(conn)
        read_request(conn)
        evil(conn)

    s = fake(script)
    c = Client.connect(s.addr, timeout=5)
    # Refused, not waited out: a timeout would be CallTimeout, which is neither.
    with pytest.raises((ProtocolError, ConnectionClosed)):
        c.call("x")
    c.close()


def test_server_gone(own_server: Server) -> None:
    c = Client.connect(own_server.addr)
    assert c.call("slow", {"ms": 1}) == 1
    own_server.kill()
    with pytest.raises(ConnectionClosed):
        c.call("slow", {"ms": 1})
    assert c.closed
    c.close()


def test_busy_polling_is_an_option(demo: Server) -> None:
    """`busy_poll_us`: 0 sleeps at once, a positive value polls first, and both answer
    the same; a negative value is refused."""
    for us in (0, 200):
        with ferry_client.Client.connect(demo.addr, busy_poll_us=us) as c:
            assert c._spin == us / 1e6
            assert c.call("add", [1, 2]) == 3
            with pytest.raises(ferry_client.CallTimeout):  # the deadline still holds
                c.call("sleep", {"ms": 500}, timeout=0.05)
    with pytest.raises(ValueError, match="busy_poll_us"):
        ferry_client.Client.connect(demo.addr, busy_poll_us=-1)
    cpus = len(os.sched_getaffinity(0))
    with ferry_client.Client.connect(demo.addr) as c:
        assert c._spin == (50e-6 if cpus >= 2 else 0.0)


def test_connect_options_are_the_keyword_arguments(demo: Server) -> None:
    """`ConnectOptions` connects every kind of connection as the keyword arguments of the
    same names do (a connect with `options` alone also checks that each keyword's default
    is the field's); a keyword that disagrees with `options` is a TypeError, one at its
    default (as the generated clients pass them on) or equal to it is not."""
    opts = ferry_client.ConnectOptions(timeout=5.0, shm=False, busy_poll_us=0)
    with Client.connect(demo.addr, options=opts) as c:
        assert (c.channel, c.timeout, c._spin) == ("inline", 5.0, 0.0)
        assert c.call("add", [1, 2]) == 3
    with Client.connect(demo.addr, options=opts, shm=False, timeout=60.0) as c:
        assert (c.channel, c.timeout) == ("inline", 5.0)
    with DemoClient.connect(demo.addr, options=opts) as d:
        assert (d.client.channel, d.client.timeout) == ("inline", 5.0)
    with ferry_client.Pipe.connect(demo.addr, options=opts) as p:
        assert (p.channel, p.timeout) == ("inline", 5.0)
    with pytest.raises(TypeError, match="disagree with it: timeout, token;"):
        Client.connect(demo.addr, options=opts, timeout=1.0, token="x")
    with pytest.raises(TypeError, match="must be a ferry_client.ConnectOptions"):
        Client.connect(demo.addr, options={"shm": False})  # type: ignore[arg-type]
    assert "secret" not in repr(ferry_client.ConnectOptions(token="secret"))

    async def main() -> None:
        c = await AsyncClient.connect(demo.addr, options=opts)
        assert (c.channel, c.timeout) == ("inline", 5.0)
        assert await c.call("add", [1, 2]) == 3
        await c.close()
        with pytest.raises(TypeError, match="disagree with it: cuda;"):
            await AsyncClient.connect(demo.addr, options=opts, cuda=False)

    asyncio.run(main())


def test_an_array_sent_again_reuses_its_descriptor_and_keeps_no_slot() -> None:
    """A pool array sent repeatedly takes the remembered descriptor (`_Sent`), which holds
    neither the array nor its slot: arrays dropped after their calls give their memory back."""
    server = Server("demo")
    try:
        with Client.connect(server.addr) as c:
            pool = c._session.pool
            assert pool is not None
            for _ in range(30):
                a = c.alloc((1920, 1080, 3), "f32")
                a[...] = 0.5
                for _ in range(3):  # the 2nd and 3rd sends use the memo
                    back = c.call("echo", {"tensor": a})
                    assert np.shares_memory(back, a) and back[1, 2, 0] == 0.5
                    del back
                del a
            assert c._session._sent, "the memo was used"
            assert len(pool.segments) <= 2, [s.size for s in pool.segments]
    finally:
        server.kill()


def test_an_array_sent_again_is_marked_lazy_release(demo: Server) -> None:
    """The first send of a pool array is an ordinary lease (released with the answer when
    large); a send of the same array again says `lazy_release` (this side keeps that
    memory, so the server may batch the release: PROTOCOL.md 11.5)."""
    with Client.connect(demo.addr) as c:
        session = c._session
        pool = session.pool
        assert pool is not None
        a = c.alloc((256, 1024), "f32")
        for _ in range(
            2
        ):  # (the first announces the segment, the second remembers `a`)
            c.call("echo", {"tensor": a})
        b = c.alloc((256, 1024), "f32")  # (in the same segment)
        # (the compact form's marker: PROTOCOL.md 7.3; test_compact.py has the object's)
        mark = b",true]" if session.compact else b',"lazy_release":true}}'
        for arr, lazy in ((b, False), (a, True)):
            out = c._rpc.request("echo", {"tensor": arr}, 1000)
            assert (mark in bytes(out.parts[0])) is lazy
            out.done()
            pool.revoke([max(pool.granted)])  # (never sent)
        for _ in range(50):  # and the server takes it, batching those releases
            back = c.call("echo", {"tensor": a})
            assert np.shares_memory(back, a)
            del back
        c.flush_releases()


def test_a_resent_array_with_a_new_layout_is_described_anew(demo: Server) -> None:
    with Client.connect(demo.addr) as c:
        a = c.alloc((4, 6), "i32")
        a[...] = np.arange(24, dtype=np.int32).reshape(4, 6)
        for _ in range(2):
            assert np.array_equal(c.call("echo", {"tensor": a}), a)
        a.shape = (6, 4)  # the same array object, another shape
        back = c.call("echo", {"tensor": a})
        assert back.shape == (6, 4) and np.array_equal(back, a)
        assert np.shares_memory(back, a)
        view = a[:, ::2]  # a view of it: its own descriptor (strided)
        for _ in range(2):
            got = c.call("echo", {"tensor": view})
            assert got.shape == (6, 2) and np.array_equal(got, view)


def test_a_message_that_fails_remembers_no_descriptor(demo: Server) -> None:
    """Two arrays of a new segment: the first announces it, the second would be remembered
    without the announcement. If the message then fails (here its header is over the
    server's limit), the segment is unannounced again, and the next send of the second
    array must announce it, not reuse a remembered descriptor."""
    with Client.connect(demo.addr) as c:
        a = c.alloc((64, 64), "f32")
        b = c.alloc((64, 64), "f32")
        a[...] = 1.0
        b[...] = 2.0
        limit = c._session.peer_limits.max_header_bytes
        with pytest.raises(LimitError, match="max_header_bytes"):
            c.call("echo", {"tensor": [a, b], "pad": "x" * (limit + 1)})
        for _ in range(3):
            back = c.call("echo", {"tensor": b})
            assert np.shares_memory(back, b) and back[0, 0] == 2.0


def test_an_array_sent_as_another_dtype_is_not_described_as_before(
    demo: Server,
) -> None:
    """numpy's u16 and bf16 dtypes compare equal: the remembered descriptor must not carry
    one for the other."""
    with Client.connect(demo.addr) as c:
        u = c.alloc((8,), "u16")
        u[...] = 0x3FC0  # 1.5 as bf16
        for _ in range(2):
            assert c.call("echo", {"tensor": u}).dtype == np.uint16
        back = c.call("echo", {"tensor": Tensor(u, "bf16")})
        assert back.dtype == BF16 and float(bf16_to_f32(back)[0]) == 1.5
