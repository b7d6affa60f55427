"""Round trips through `ferry.Pipe` between two Python processes on one host: a 64-byte
uint8 array with a small header, echoed by a child process, `--iters` times after a tenth
as many untimed. On Linux the pipe agrees on the same-host ring (issue 22), and both sides
send and receive on their own threads (`Pipe.send` / `Pipe.recv` release the GIL and wait
on the ring itself).

    python bindings/python/bench/bench_pipe.py --iters 20000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

import ferry


def peer(addr: str) -> None:
    """Echoes every message until `bye`."""
    pipe = ferry.connect(addr)
    while True:
        header, ts = pipe.recv(timeout=60)
        pipe.send(header, ts)
        if header.get("bye"):
            return


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        peer(args.peer)
        return
    addr = f"unix:ferry-bench-pipe-{os.getpid()}"
    listener = ferry.listen(addr)
    child = subprocess.Popen([sys.executable, __file__, "--peer", addr])
    try:
        pipe = listener.accept(timeout=30)
        data = np.full(64, 7, dtype=np.uint8)
        header = {"bench": "64B"}
        times = []
        for i in range(args.iters + args.iters // 10):
            t = time.perf_counter_ns()
            pipe.send(header, [data])
            back, ts = pipe.recv(timeout=30)
            took = time.perf_counter_ns() - t
            if back != header or ts[0].nbytes != 64:
                raise SystemExit(
                    f"round trip {i} came back changed: {back} {[t.shape for t in ts]}"
                )
            if i >= args.iters // 10:
                times.append(took)
        pipe.send({"bye": True})
        pipe.recv(timeout=30)
        times.sort()
        p50, p99 = times[len(times) // 2] / 1e3, times[len(times) * 99 // 100] / 1e3
        what = f"python pipe 64B ring={pipe.ring}  iters {len(times)}"
        print(f"{what}  p50 {p50:.2f} us  p99 {p99:.2f} us")
    finally:
        if child.wait(30) != 0:
            raise SystemExit(f"the peer exited with {child.returncode}")


if __name__ == "__main__":
    main()
