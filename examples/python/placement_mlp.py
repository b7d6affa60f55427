"""An MLP larger than the store's fast tier, its layers behind tensor references.

    python examples/python/placement_mlp.py             # starts `ferry serve-weights`
    python examples/python/placement_mlp.py --addr unix:ferry-weights   # a running one
    python examples/python/placement_mlp.py --record-trace mlp.jsonl  # record its uses

The layers' weights (8 x 4 MiB by default) are kept on a tensor store started with
`--placement`: a cpu tier of 12 MiB (shared memory) above a disk tier (files). The
forward pass fetches each layer where it is (a zero-copy view of the server's memory over
shm; a layer on disk is read into memory first) and multiplies. It runs twice from a cold
cpu tier:

- `lru`, no schedule: a cyclic pass over more layers than fit is LRU's worst case; every
  layer is read from disk when it is needed, and the pass waits for each read.
- `flow` with the layer order declared (`schedule`): the store reads the next layers in
  while numpy computes this one, so uses find their layer in memory.

Both give exactly the numbers of the same MLP computed from in-memory arrays. The table
shows what the store counted (uses; hits, uses of a layer placed in the cpu tier; waits,
uses that waited for bytes from disk; MiB read from disk; ms the uses waited) and the
passes' wall time. On a machine with few cores, numpy's own threads compete with the
store's copies (`OPENBLAS_NUM_THREADS=1` leaves them a core).

With `--record-trace FILE` the store it starts records every use of a layer its policy
sees (`ferry serve-weights --record-trace`) for `cargo xtask placement-bench --trace FILE`
to replay; store/examples/traces/mlp.jsonl was recorded so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ferry import Client
from ferry.placement import schedule, set_store_placement, store_placement
from ferry.refs import TensorRef, fetch, free, keep

F32 = npt.NDArray[np.float32]
MIB = 1 << 20


@dataclass
class Row:
    """One run's numbers."""

    policy: str
    scheduled: bool
    uses: int
    hits: int
    waits: int
    mib_read: float
    stalled_ms: float
    wall_ms: float
    exact: bool
    """The output equals the in-memory MLP's, bit for bit."""


def forward(x: F32, layers: list[F32]) -> F32:
    """The MLP: ReLU after each layer."""
    for w in layers:
        x = np.maximum(x @ w, 0)
    return x


def run(
    client: Client,
    refs: list[TensorRef],
    x: F32,
    expected: F32,
    policy: str,
    scheduled: bool,
    passes: int,
) -> Row:
    """`passes` forward passes with the layers fetched from the store, from a cold cpu
    tier (a policy change empties it)."""
    set_store_placement(client, policy=policy)
    before = store_placement(client).stats
    assert before is not None, "the store has no tiers: start it with --placement"
    if scheduled:
        schedule(client, refs * passes)
    started = time.perf_counter()
    exact = True
    for _ in range(passes):
        y = x
        for r in refs:
            w = fetch(client, r)  # a read-only view of the store's memory
            y = np.maximum(y @ w, 0)
            del w  # (lets the store free it if it moved meanwhile)
        exact = exact and bool(np.array_equal(y, expected))
    wall = time.perf_counter() - started
    after = store_placement(client).stats
    assert after is not None
    return Row(
        policy=policy,
        scheduled=scheduled,
        uses=after.uses - before.uses,
        hits=after.hits - before.hits,
        waits=after.waits - before.waits,
        mib_read=(after.bytes_read - before.bytes_read) / MIB,
        stalled_ms=after.stalled_ms - before.stalled_ms,
        wall_ms=wall * 1e3,
        exact=exact,
    )


def example(client: Client, layers: int, hidden: int, batch: int, passes: int) -> list[Row]:
    """Keeps the MLP's layers on the store, then runs it with `lru` and with `flow` and
    the declared layer order."""
    rng = np.random.default_rng(0)
    weights = [
        (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
        for _ in range(layers)
    ]
    x = rng.standard_normal((batch, hidden)).astype(np.float32)
    expected = forward(x, weights)
    refs = [keep(client, w) for w in weights]
    del weights  # the store holds them now
    try:
        return [
            run(client, refs, x, expected, "lru", False, passes),
            run(client, refs, x, expected, "flow", True, passes),
        ]
    finally:
        free(client, *refs)


def ferry_binary() -> str:
    """`$FERRY_BIN`, `ferry` on the PATH, or this checkout's debug or release build."""
    env = os.environ.get("FERRY_BIN")
    found = env or shutil.which("ferry")
    if found:
        return found
    repo = Path(__file__).resolve().parents[3]
    for profile in ("release", "debug"):
        candidate = repo / "target" / profile / "ferry"
        if candidate.exists():
            return str(candidate)
    raise SystemExit("no ferry binary: set FERRY_BIN or build it (cargo build -p ferry-cli)")


def serve(
    cpu_mib: int, disk_dir: str, record_trace: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Starts `ferry serve-weights --placement flow` with an empty store (recording its
    uses to `record_trace` when given); its address."""
    addr = f"unix:ferry-placement-mlp-{os.getpid()}"
    cmd = [ferry_binary(), "serve-weights", "--name", "mlp", "--placement", "flow"]
    cmd += ["--cpu-budget-mib", str(cpu_mib), "--disk-dir", disk_dir, "--addr", addr]
    if record_trace is not None:
        cmd += ["--record-trace", record_trace]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "listening on ..." once it is ready
    if not line.startswith(b"listening on"):
        proc.kill()
        raise SystemExit(f"ferry serve-weights did not start: {line!r}")
    return proc, addr


def main(argv: list[str] | None = None) -> int:
    """Runs the example; prints a table (or JSON lines with `--json`)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    p.add_argument("--addr", help="a store started with --placement (default: start one)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--cpu-budget-mib", type=int, default=12)
    p.add_argument("--json", action="store_true", help="one JSON object per run")
    p.add_argument(
        "--record-trace",
        metavar="FILE",
        help="the store started here records its uses to FILE (JSON lines)",
    )
    a = p.parse_args(argv)
    if a.addr and a.record_trace:
        p.error("--record-trace needs a store started here (no --addr)")
    with tempfile.TemporaryDirectory(prefix="ferry-mlp-") as disk:
        proc, addr = (None, a.addr) if a.addr else serve(a.cpu_budget_mib, disk, a.record_trace)
        try:
            with Client.connect(addr) as c:
                rows = example(c, a.layers, a.hidden, a.batch, a.passes)
                info = store_placement(c)
        finally:
            if proc is not None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=30)
    layer_mib = a.hidden * a.hidden * 4 / MIB
    if a.json:
        for r in rows:
            print(json.dumps(asdict(r)))
    else:
        print(
            f"MLP: {a.layers} layers of {layer_mib:.1f} MiB ({a.layers * layer_mib:.0f} MiB), "
            f"cpu tier {(info.cpu_budget_bytes or 0) / MIB:.0f} MiB, {a.passes} passes"
        )
        print(
            f"{'policy':<16}{'uses':>6}{'hits':>6}{'waits':>7}{'MiB read':>10}"
            f"{'waited ms':>11}{'wall ms':>10}  exact"
        )
        for r in rows:
            name = r.policy + (" + schedule" if r.scheduled else "")
            print(
                f"{name:<16}{r.uses:>6}{r.hits:>6}{r.waits:>7}{r.mib_read:>10.1f}"
                f"{r.stalled_ms:>11.1f}{r.wall_ms:>10.1f}  {r.exact}"
            )
    return 0 if all(r.exact for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
