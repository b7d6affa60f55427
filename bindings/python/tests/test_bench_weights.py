"""The weight-sync benchmark (`cargo xtask bench-weights`, issue 47) at a small size: CI's
check of fan-out across hosts. A store and two subscribers, each in a network namespace
with the publisher's link limited by `tc`, where this machine lets the test make them
(root); loopback otherwise (the benchmark says which, and so does this test's output).
Checked: every subscriber applied the measured version as sparse deltas (each checked
against its BLAKE3 digests by `update`), and was sent only the changed elements' share of
the bytes, once. No timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_weights.py"
MIB = 8
SUBS = 2
ARGS = [sys.executable, str(BENCH), "--no-gloo", "--no-same-host"]


def test_the_weight_sync_benchmark_sends_each_subscriber_only_the_changed_elements() -> None:
    pytest.importorskip("torch")
    try:
        proc = subprocess.run(
            [*ARGS, "--mib", str(MIB), "--subs", str(SUBS), "--rates", "1gbit"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"bench_weights.py did not finish within 600 s; stderr: {e.stderr!r}")
    out, err = proc.stdout[-3000:], proc.stderr[-3000:]
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}\n{err}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"rate"')]
    assert len(rows) == 1, proc.stdout
    row = rows[0]
    namespaces = row["rate"] == "1gbit"
    over = "network namespaces behind tc (1gbit)" if namespaces else "loopback (no namespaces)"
    print(f"bench-weights ran over {over}")
    assert row["full"]["bytes"] == MIB << 20, row["full"]
    subs = row["delta"]["subs"]
    assert len(subs) == SUBS, subs
    versions = {s["version"] for s in subs}
    assert len(versions) == 1 and versions.pop() >= 2, subs
    for s in subs:
        assert s["dense"] == 0 and s["sparse"] > 0, s
        assert s["full_bytes"] == MIB << 20, s
        # A 1% step: indices and values of 1% of the elements, about 3% of the bytes.
        assert 0 < s["sent_bytes"] <= 0.05 * s["full_bytes"], s
