"""ferry as Ray's tensor transport (`ferry.ray`): `tests/ray_checks.py` in child processes, one
Ray instance each (one node; two nodes on this host with the remote path forced).

Skipped, saying why, where Ray (>= 2.60, with Ray Direct Transport) or torch cannot be imported
by this Python: `pip install "ferry-tensors[ray]"` and torch install them.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_examples import torch_import_error

TIMEOUT = 400.0
"""Seconds one run of the checks may take (a failure, never a measurement; about 20 s here,
220 s beside two CPU burners)."""

# The first test of each mode runs all its checks (`run_checks`), after the import check:
# pytest-timeout's default (120 s, pyproject.toml) would end it before either bound above
# on a busy machine (seen: the one-node run beside two CPU burners).
pytestmark = pytest.mark.timeout(2 * TIMEOUT + 60)

ONE_NODE = [
    "one node: a tensor reaches the consumer intact",
    "one node: the consumer's tensor is a mapping of the producer's memfd (zero-copy)",
    "one node: the fetch went over the unix socket",
    "one node: a tensor made by ferry.ray.empty is lent without a copy",
    "one node: any other tensor is copied in once",
    "one node: several tensors of several dtypes in one object",
    "one node: ray.get in the driver fetches through ferry",
    "garbage_collect: the producer holds a live object",
    "garbage_collect: out-of-scope objects are freed by the producer",
    "a receiver without enable_tensor_transport gets an error that says so",
    "reuse: a freed object's segment is filled again for the next object of its size",
    "reuse: a consumer's held tensor keeps its bytes while later objects of its size pass",
    "reuse: a held tensor's segment comes back once the consumer drops it",
    "reuse: the pool gives its memory back after pool_idle (4.0 s)",
    "1000 transfers arrive intact",
    "1000 transfers: memfd mappings back where they started",
    "1000 transfers: RSS back where it started",
    "1000 transfers: nothing new in /dev/shm",
    "abort_transport ends a fetch in flight with TransferError",
    "a consumer whose producer died gets ProducerGone",
]

TWO_NODES = [
    "two nodes: the producer and the far consumer are on different nodes",
    "two nodes: a tensor reaches a consumer on another node over QUIC",
    "two nodes: force_remote sends a same-node consumer over QUIC too",
    "two nodes: the QUIC address pins the producer's certificate",
    "two nodes: a peer without the configured token is refused",
    "two nodes: a consumer whose producer died gets ProducerGone",
]


@functools.cache
def ray_import_error() -> str | None:
    """Why `ray.experimental.rdt` cannot be imported here (None when it can), checked in a
    child process (see `torch_import_error`)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import ray.experimental.rdt"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {proc.returncode}"


@functools.cache
def run_checks(mode: str) -> str:
    """The output of `ray_checks.py MODE` (stdout and stderr)."""
    why = ray_import_error()
    if why is not None:
        pytest.skip(
            f"Ray >= 2.60 is not importable by {sys.executable} "
            f'(pip install "ferry-tensors[ray]"): {why}'
        )
    why = torch_import_error()
    if why is not None:
        pytest.skip(f"torch is not importable by {sys.executable}: {why}")
    # Ray starts its workers at nice 15 (RAY_worker_niceness): beside two nice-0 CPU
    # burners they got 3-5% of a CPU each, and the two-node run's three actors did not
    # start within 60 s (2 runs in 2). The checks are about ferry's transfers, not Ray's
    # scheduling: the workers run at nice 0, as the driver does.
    env = {**os.environ, "RAY_worker_niceness": "0"}
    try:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "ray_checks.py"), mode],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        return f"timed out after {TIMEOUT} s\n{e.stdout!r}\n{e.stderr!r}"
    return f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("check", ONE_NODE)
def test_one_node(check: str) -> None:
    out = run_checks("one-node")
    assert f"PASS {check}\n" in out, out[-6000:]


@pytest.mark.parametrize("check", TWO_NODES)
def test_two_nodes(check: str) -> None:
    out = run_checks("two-nodes")
    assert f"PASS {check}\n" in out, out[-6000:]
