"""Benchmark of the tensor store from Python (issue 18's speed targets), all in one run:

- `open` of a 1,000-tensor 1 GiB bundle against the `open` of a one-tensor bundle of the
  same bytes (p50 over repeated opens, arrays dropped between);
- open a published 1 GiB safetensors checkpoint and sum every tensor, against
  `safetensors.numpy.load_file` and `safe_open` on the same page-cached file;
- get every tensor without touching it, against the same.

    FERRY_BIN=target/release/ferry python bindings/python/bench/store_open.py [--gib 1] [--opens 30]

Needs numpy and safetensors; writes its checkpoints under $TMPDIR (removed after).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from ferry import Client, open_bundle


def ferry_bin() -> str:
    return os.environ.get("FERRY_BIN", "target/release/ferry")


def write_checkpoint(path: Path, tensors: int, total: int) -> None:
    per = total // tensors // 4
    rng = np.random.default_rng(1)
    block = rng.standard_normal(per).astype(np.float32)
    save_file({f"layers.{i}.weight": block + i for i in range(tensors)}, str(path))


def serve(path: Path, name: str, addr: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        [ferry_bin(), "serve-weights", str(path), "--name", name, "--addr", addr],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith(b"listening on"):
        p.kill()
        raise SystemExit(f"ferry serve-weights did not start: {line!r}")
    return p


def warm(path: Path) -> None:
    """Reads the file so that the page cache holds it."""
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def p50(f: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        gc.collect()
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
        del out
    return statistics.median(times)


def sum_all(sd: Any) -> float:
    return float(sum(float(v.sum(dtype=np.float64)) for v in sd.values()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--opens", type=int, default=30)
    ap.add_argument("--sums", type=int, default=5)
    a = ap.parse_args()
    total = int(a.gib * (1 << 30))
    tmp = Path(tempfile.mkdtemp(prefix="ferry-store-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        many, one = tmp / "many.safetensors", tmp / "one.safetensors"
        write_checkpoint(many, 1000, total)
        write_checkpoint(one, 1, total)
        pid = os.getpid()
        addr_many, addr_one = (
            f"unix:ferry-bench-many-{pid}",
            f"unix:ferry-bench-one-{pid}",
        )
        procs.append(serve(many, "many", addr_many))
        procs.append(serve(one, "one", addr_one))
        with Client.connect(addr_many) as cm, Client.connect(addr_one) as co:
            open_bundle(cm, "many")  # (first mapping, warm-up)
            open_bundle(co, "one")
            t_many = p50(lambda: open_bundle(cm, "many"), a.opens)
            t_one = p50(lambda: open_bundle(co, "one"), a.opens)
            print(f"open 1000 tensors, {a.gib:g} GiB: p50 {t_many * 1e3:.3f} ms")
            print(f"open 1 tensor,     {a.gib:g} GiB: p50 {t_one * 1e3:.3f} ms")
            print(f"  ratio {t_many / t_one:.2f}x (target <= 2x; p50 target <= 2 ms)")

            warm(many)
            want = sum_all(load_file(str(many)))

            def ferry_sum() -> float:
                return sum_all(open_bundle(cm, "many"))

            def st_load_sum() -> float:
                return sum_all(load_file(str(many)))

            def st_open_sum() -> float:
                with safe_open(str(many), framework="np") as f:
                    return float(
                        sum(float(f.get_tensor(k).sum(dtype=np.float64)) for k in f.keys())  # noqa: SIM118 (safe_open has no __iter__)
                    )

            assert abs(ferry_sum() - want) <= 1e-6 * abs(want) + 1e-3
            rows = [
                ("ferry open + sum", p50(ferry_sum, a.sums)),
                ("safetensors load_file + sum", p50(st_load_sum, a.sums)),
                ("safetensors safe_open + sum", p50(st_open_sum, a.sums)),
            ]
            for label, t in rows:
                print(f"{label:32} {t * 1e3:9.1f} ms")
            best_st = min(rows[1][1], rows[2][1])
            print(f"  ratio ferry / best safetensors: {rows[0][1] / best_st:.2f}x (target <= 1.0x)")

            def ferry_get() -> int:
                return len(open_bundle(cm, "many").state_dict())

            def st_load() -> int:
                return len(load_file(str(many)))

            def st_open_get() -> int:
                with safe_open(str(many), framework="np") as f:
                    return len([f.get_tensor(k) for k in f.keys()])  # noqa: SIM118

            get_rows = [
                ("ferry open (every tensor)", p50(ferry_get, a.sums)),
                ("safetensors load_file", p50(st_load, a.sums)),
                ("safetensors safe_open get_tensor", p50(st_open_get, a.sums)),
            ]
            for label, t in get_rows:
                print(f"{label:32} {t * 1e3:9.3f} ms")
            best = min(get_rows[1][1], get_rows[2][1])
            print(f"  speedup vs best safetensors: {best / get_rows[0][1]:.0f}x (target >= 10x)")
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
