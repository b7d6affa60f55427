"""CUDA tensors over the cuda-ipc channel from Python: round trips of one device tensor
(made with `pipe.alloc(..., device="cuda:0")`, so only descriptors travel) to `ferry
__echo`, which sends every message back. Prints the p50 and p99 in microseconds; what
the tests check is that the bytes come back (`tests/test_cuda_gpu.py`), not how fast.

On a GPU machine, with CuPy installed:

    cargo build --release -p ferry-cli --features cuda-ipc
    FERRY_BIN=target/release/ferry python sdks/python/bench/bench_cuda_rtt.py [--iters N]
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import statistics
import subprocess
import time
from typing import Any

from ferry_client import Pipe


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\\n\\n")[0] if __doc__ else None
    )
    ap.add_argument(
        "--iters", type=int, default=200, help="timed round trips (default 200)"
    )
    ap.add_argument("--shape", default="1920,1080,3", help="the f32 tensor's shape")
    a = ap.parse_args()
    cp: Any = importlib.import_module("cupy")  # (here: the module imports without CuPy)

    ferry = os.environ.get("FERRY_BIN", "target/release/ferry")
    addr = f"unix:ferry-bench-cuda-{os.getpid()}"
    peer = subprocess.Popen(
        [ferry, "__echo", addr], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert peer.stdout is not None
        ready, _, _ = select.select([peer.stdout], [], [], 30.0)
        if not ready or not peer.stdout.readline().startswith(b"ready "):
            raise SystemExit(f"{ferry} __echo {addr} did not start")
        shape = [int(n) for n in a.shape.split(",")]
        with Pipe.connect(addr, cuda=True) as p:
            if p.welcome.get("channels", {}).get("cuda") != "cuda-ipc":
                raise SystemExit(f"{ferry} was built without the cuda-ipc feature")
            t = p.alloc(shape, "f32", device="cuda:0")
            t[...] = cp.float32(1)
            samples = []
            for _ in range(a.iters):
                t0 = time.perf_counter()
                p.send({}, [t])
                [back] = p.recv(timeout=30).tensors
                samples.append(time.perf_counter() - t0)
                del back
        samples.sort()
        p50 = statistics.median(samples) * 1e6
        p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e6
        print(
            f"cuda-ipc f32{shape} round trip: p50 {p50:.1f} us, p99 {p99:.1f} us ({a.iters} iters)"
        )
    finally:
        peer.kill()
        peer.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
