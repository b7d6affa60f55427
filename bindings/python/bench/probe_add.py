"""Where the Python-served `add` spends its time (issue 44, point 8's `add` target).

1. The Python work of one served call, in-process: `add`'s wrapper (`_Function.call_sync`:
   context, kwargs checks, the call, the result's JSON) timed with `timeit`, with no
   server, socket or thread around it. A stand-in takes the native context's place: `add`
   uses none of it.
2. `add(1, 2)` from one `ferry.Client` to `ferry serve` (Rust) and to
   `python -m ferry serve bench_app:app` (Python), interleaved in rounds; arguments after
   `--` go to the Python server (`-- --busy-poll-us 0`).

The ratio target (Python-served within 1.2x of Rust-served) leaves the Python side 0.2x
of a Rust-served round trip; part 1 says what the interpreter alone takes of it.

    FERRY_BIN=target/release/ferry target/bench-python-venv/bin/python \\
        bindings/python/bench/probe_add.py [--rounds N] [--iters N] [-- SERVER_ARGS..]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
from pathlib import Path

import ferry

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_server import start, stop  # noqa: E402  (a sibling script, found through HERE)


def python_work(n: int) -> float:
    """Seconds of Python work per served `add` call, in-process."""
    import bench_app

    f = bench_app.app._functions["add"]
    params = {"a": 1, "b": 2}
    stand_in = object()
    out = f.call_sync(params, [], stand_in)  # type: ignore[arg-type]
    assert out == ("3.0", []), out
    return timeit.timeit(lambda: f.call_sync(params, [], stand_in), number=n) / n  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--iters", type=int, default=300, help="timed calls per server and round")
    ap.add_argument("server_args", nargs="*", help="after --: for the Python server")
    a = ap.parse_args()
    ferry_bin = os.environ.get("FERRY_BIN")
    if not ferry_bin:
        raise SystemExit("set FERRY_BIN to a release `ferry` binary")
    work = python_work(100_000)
    tag = str(os.getpid())
    rs_addr, py_addr = f"unix:ferry-probe-rs-{tag}", f"unix:ferry-probe-py-{tag}"
    procs = [
        start([ferry_bin, "serve", rs_addr], "listening on"),
        start(
            [sys.executable, "-m", "ferry", "serve", "bench_app:app", py_addr, *a.server_args],
            "listening on",
            cwd=HERE,
        ),
    ]
    times: dict[str, list[float]] = {"rust-served": [], "python-served": []}
    try:
        clients = {
            "rust-served": ferry.Client.connect(rs_addr),
            "python-served": ferry.Client.connect(py_addr),
        }
        for _ in range(a.rounds):
            for who, c in clients.items():
                for _ in range(max(10, a.iters // 10)):
                    c.call("add", [1, 2])
                for _ in range(a.iters):
                    t = time.perf_counter()
                    c.call("add", [1, 2])
                    times[who].append(time.perf_counter() - t)
        for c in clients.values():
            c.close()
    finally:
        for p in procs:
            stop(p)
    rs, py = (statistics.median(times[k]) * 1e6 for k in ("rust-served", "python-served"))
    print(f"python work per call, in-process: {work * 1e6:.2f} us")
    print(f"add p50: rust-served {rs:.1f} us, python-served {py:.1f} us, ratio {py / rs:.2f}")
    extra = py - rs
    print(f"python-served minus rust-served: {extra:.1f} us ({extra / (work * 1e6):.1f}x the work)")
    print(f"floor of the ratio with no cost but the work: {(rs + work * 1e6) / rs:.2f}")


if __name__ == "__main__":
    main()
