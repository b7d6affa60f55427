"""CUDA tensors through CuPy against real ferry peers, on a machine with a GPU.

Skipped (with the reason) where CuPy, a device, or a `ferry` built with the `cuda-ipc`
feature is missing; `FERRY_REQUIRE_CUDA=1` turns those skips into failures. On a GPU
machine:

    cargo build --release -p ferry-cli --features cuda-ipc
    pip install ./sdks/python cupy-cuda12x        # torch too, for the DLPack check
    FERRY_BIN=target/release/ferry FERRY_REQUIRE_CUDA=1 \\
        python -m pytest sdks/python/tests/test_cuda_gpu.py -v
"""

from __future__ import annotations

import importlib
from typing import Any


from conftest import EchoPeer, Server, need
from ferry_client import Client, Pipe


def _cuda_pipe(peer: EchoPeer) -> Pipe:
    p = Pipe.connect(peer.addr, cuda=True)
    if p.welcome.get("channels", {}).get("cuda") != "cuda-ipc":
        p.close()
        need("the ferry binary was built without the cuda-ipc feature")
    return p


def test_echo_round_trip_is_zero_copy(cp: Any, echo_peer: EchoPeer) -> None:
    with _cuda_pipe(echo_peer) as p:
        a = p.alloc([1920, 1080, 3], "f32", device="cuda:0")
        a[...] = cp.arange(a.size, dtype=cp.float32).reshape(a.shape)
        p.send({"n": 1}, [a])
        msg = p.recv(timeout=30)
        [back] = msg.tensors
        assert isinstance(back, cp.ndarray)
        assert back.data.ptr == a.data.ptr  # this side's own memory, sent back
        assert bool((back == a).all())
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            return
        t = torch.from_dlpack(back)
        assert t.is_cuda and t.data_ptr() == back.data.ptr


def test_other_cupy_arrays_go_with_one_copy(cp: Any, conformance: Server) -> None:
    with Client.connect(conformance.addr, cuda=True) as c:
        if c.welcome.get("channels", {}).get("cuda") != "cuda-ipc":
            need("the ferry binary was built without the cuda-ipc feature")
        x = cp.arange(1000, dtype=cp.float32).reshape(10, 100)
        y = c.call("echo", {"tensor": x.T})  # strided: copied contiguous into the pool
        assert isinstance(y, cp.ndarray) and bool((y == x.T).all())


def test_server_memory_arrives_zero_copy(cp: Any, conformance: Server) -> None:
    """A CUDA tensor the server allocated and filled: mapped here (cuIpcOpenMemHandle),
    read after the server's event, released when dropped."""
    from ferry_client.generated.conformance import ConformanceClient

    with ConformanceClient.connect(conformance.addr, cuda=True) as c:
        if c.client.welcome.get("channels", {}).get("cuda") != "cuda-ipc":
            need("the ferry binary was built without the cuda-ipc feature")
        want = c.make("f32", [64, 128])
        for _ in range(3):  # the second and third map nothing new (the cache)
            got = c.make_cuda("f32", [64, 128])
            assert isinstance(got, cp.ndarray)
            assert bool((cp.asnumpy(got) == want).all())
            view = got[3:5]
            del got
            assert float(view[0, 0]) == float(want[3, 0])
            del view
        c.client.flush_releases()
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            return
        t = torch.from_dlpack(c.make_cuda("f32", [8]))
        assert t.is_cuda and t.shape == (8,)


def test_repeated_round_trips_bring_back_each_payload(
    cp: Any, echo_peer: EchoPeer
) -> None:
    """Round trips of one device tensor, rewritten before each: every echo comes back as
    this side's own memory holding what was written last (no stale mapping, no copy).
    Its speed is a benchmark's (`sdks/python/bench/bench_cuda_rtt.py`), not a test's."""
    with _cuda_pipe(echo_peer) as p:
        a = p.alloc([256, 1024], "f32", device="cuda:0")
        for i in range(20):
            a[...] = cp.arange(a.size, dtype=cp.float32).reshape(a.shape) + i
            p.send({"i": i}, [a])
            msg = p.recv(timeout=30)
            [back] = msg.tensors
            assert msg.header == {"i": i}
            assert isinstance(back, cp.ndarray) and back.shape == a.shape
            assert back.data.ptr == a.data.ptr
            assert float(back[0, 0]) == float(i) and float(back[-1, -1]) == float(
                a.size - 1 + i
            )
            assert bool((back == a).all())
            del back
