"""The tensor store under processes racing (PROTOCOL.md section 20): a publisher makes
version after version while reader processes open the latest, re-open versions they hold and
versions others may be freeing, and get killed while holding one; and the budget counts the
versions readers hold. Every loop is bounded; nothing asserts how long anything took."""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from safetensors.numpy import save_file

from ferry import Client, RpcError, open_bundle
from ferry.store import publish
from tests.client.servers import Server, unique_addr
from tests.client.test_store import held_versions, until

NOT_FOUND = -32009
LIMIT_EXCEEDED = -32001
WAIT = 60.0
"""Seconds a wait for a child gives up after (a failure, never a measurement)."""

VERSIONS = 40
"""Versions the publisher makes after the checkpoint's (2 .. VERSIONS + 1)."""
FINAL = VERSIONS + 1
READERS = 4


def filled(v: int) -> dict[str, npt.NDArray[Any]]:
    """Version `v`'s tensors: every element of every tensor is `v`. Published with 1 MiB
    buckets they lie in three, so a version torn between buckets would show."""
    return {
        "big": np.full(300_000, v, np.float32),  # 1.2 MB: a bucket of its own
        "half": np.full(200_000, v, np.float16),
        "steps": np.full(50_000, v, np.int64),
        "bytes": np.full(100, v, np.uint8),
        "square": np.full((64, 64), v, np.float32),
        "tail": np.full(200_000, v, np.float32),
    }


READER = textwrap.dedent(
    """
    import json, sys
    from ferry import Client, RpcError, open_bundle

    addr, final = sys.argv[1], int(sys.argv[2])

    def check(b, version=None):
        # One version, whole: every tensor holds its number, the metadata is its own.
        if version is not None:
            assert b.version == version, (b.version, version)
        for k in b:
            a = b[k]
            assert a.min() == a.max() == b.version, (b.version, k, a.min(), a.max())
        if b.version > 1:
            assert b.metadata == {"version": b.version}, (b.version, b.metadata)
        return b

    with Client.connect(addr, timeout=30) as c:
        first = check(open_bundle(c, "m"))  # held all along
        held = first  # held a while, then the latest
        print("ready", first.version, flush=True)
        seen, gone = {first.version}, 0
        for i in range(20_000):
            b = check(open_bundle(c, "m"))
            seen.add(b.version)
            # Versions this reader holds open again, whole, whatever is published.
            check(open_bundle(c, "m", first.version), first.version)
            check(open_bundle(c, "m", held.version), held.version)
            # One it may not hold (others may be letting it go): whole, or NOT_FOUND.
            try:
                check(open_bundle(c, "m", b.version - 1), b.version - 1)
            except RpcError as e:
                assert e.code == -32009, e
                gone += 1
            if b.version == final:
                break
            if i % 5 == 4:
                held = b  # the older one may go
        else:
            raise AssertionError(f"never saw version {final}: {sorted(seen)}")
        report = {"held": [first.version, held.version], "seen": len(seen), "gone": gone}
        print(json.dumps(report), flush=True)
        sys.stdin.read()  # hold `held` until killed
    """
)


def read_line(proc: subprocess.Popen[bytes]) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], WAIT)
    if not ready:
        pytest.fail(f"reader {proc.pid}: no line within {WAIT} s")
    line = proc.stdout.readline()
    if not line:
        proc.wait(WAIT)
        pytest.fail(f"reader {proc.pid} exited {proc.returncode} (its stderr is above)")
    return line


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(WAIT)
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()


@pytest.fixture
def racing(tmp_path: Path) -> Iterator[Server]:
    """`ferry serve-weights` of version 1 of `m` (every element 1), 1 MiB buckets, no
    superseded version kept for deltas (`held_versions` then shows the readers' holds)."""
    save_file(filled(1), str(tmp_path / "m.safetensors"))
    s = Server(
        "weights",
        unique_addr("race"),
        [
            "serve-weights",
            str(tmp_path / "m.safetensors"),
            "--name",
            "m",
            "--bucket-mib",
            "1",
            "--delta-bases",
            "0",
            "--addr",
        ],
    )
    try:
        yield s
    finally:
        s.kill()


def test_readers_racing_a_publisher_see_whole_versions_and_killed_ones_let_go(
    racing: Server,
) -> None:
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", READER, racing.addr, str(FINAL)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(READERS)
    ]
    try:
        for r in readers:
            assert read_line(r).split() == [b"ready", b"1"]
        victim, rest = readers[0], readers[1:]
        with Client.connect(racing.addr, timeout=30) as c:
            for v in range(2, FINAL + 1):
                # The server's own bundle: its uid may publish it again.
                p = publish(c, "m", filled(v), {"version": v})
                assert (p["name"], p["version"], p["tensors"]) == ("m", v, 6)
                if v == FINAL // 2:
                    assert victim.poll() is None, "the victim reader failed"
                    kill(victim)  # mid-race, holding a version, maybe mid-call
            reports = [json.loads(read_line(r)) for r in rest]
            print("readers:", reports)
            held = {v for r in reports for v in r["held"]} - {FINAL}
            assert 1 in held and held <= set(held_versions(c)), (held, held_versions(c))
            for v in held:
                b = open_bundle(c, "m", v)
                assert b.version == v and b["big"][0] == v
                del b
            for r in rest:
                kill(r)
            until("the killed readers' versions are freed", lambda: held_versions(c) == [])
            listed = c.call("store.list", {})
            assert [(b["name"], b["version"]) for b in listed] == [("m", FINAL)]
            # Freed versions, and ones that never were, are NOT_FOUND.
            for v in (*held, 2, FINAL + 1):
                with pytest.raises(RpcError) as e:
                    open_bundle(c, "m", v)
                assert e.value.code == NOT_FOUND, e.value
            latest = open_bundle(c, "m")
            assert latest.version == FINAL and all(
                latest[k].min() == latest[k].max() == FINAL for k in latest
            )
    finally:
        for r in readers:
            kill(r)


def test_the_budget_counts_held_versions_and_names_budget_bytes(tmp_path: Path) -> None:
    one_mib = {"w": np.full(1 << 18, 1, np.float32)}
    save_file(one_mib, str(tmp_path / "m.safetensors"))
    s = Server(
        "weights",
        unique_addr("budget"),
        [
            "serve-weights",
            str(tmp_path / "m.safetensors"),
            "--name",
            "m",
            "--budget-mib",
            "4",
            "--addr",
        ],
    )
    try:
        with Client.connect(s.addr, timeout=30) as c:
            v1 = open_bundle(c, "m")
            assert publish(c, "m", {"w": np.full(1 << 18, 2, np.float32)})["version"] == 2
            assert held_versions(c) == [1]
            big = {"w": np.zeros(5 << 19, np.uint8)}  # 2.5 MiB: over 4 with 1 + 1 in use
            with pytest.raises(RpcError) as e:
                publish(c, "big", big)
            assert e.value.code == LIMIT_EXCEEDED, e.value
            assert "budget_bytes" in e.value.message, e.value
            assert isinstance(e.value.data, dict) and e.value.data["limit"] == "budget_bytes"
            with pytest.raises(RpcError) as e:
                open_bundle(c, "big")
            assert e.value.code == NOT_FOUND, "a refused publish leaves nothing"
            del v1
            gc.collect()
            until("version 1 is freed", lambda: held_versions(c) == [])
            assert publish(c, "big", big)["version"] == 1, "the freed version's bytes are back"
    finally:
        s.kill()
