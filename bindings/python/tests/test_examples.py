"""The scripts in examples/python run and print what they promise.

Each example runs as its own process (`python examples/python/NAME.py`, which starts its
app in a child with `ferry.spawn`) under a bounded timeout. The torch example is skipped
only where torch cannot be imported by this Python.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "python"
TIMEOUT = 120.0
"""Seconds one example may take (they take about a second; torch's import adds some)."""


def run_example(name: str) -> str:
    """Runs `examples/python/NAME` and returns its stdout; fails on a non-zero exit."""
    try:
        proc = subprocess.run(
            [sys.executable, str(EXAMPLES / name)],
            cwd=EXAMPLES,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{name} did not finish within {TIMEOUT} s; stderr: {e.stderr!r}")
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr}"
    return proc.stdout


@functools.cache
def torch_import_error() -> str | None:
    """Why `import torch` fails in this Python (None when it works). Checked in a
    child process: importing torch here would change how ferry treats tensors in the
    other tests of this process."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import torch"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"import torch took over {TIMEOUT} s"
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {proc.returncode}"


def test_add_numbers() -> None:
    out = run_example("add_numbers.py")
    assert "add(a=2, b=3) = 5.0" in out
    assert "add(1.5, 2.25) = 3.75" in out
    assert "add(a='two', b=3) -> -32602 Invalid params: a:" in out


def test_create_tensor() -> None:
    out = run_example("create_tensor.py")
    assert "create_tensor: ndarray shape=(2, 3) dtype=float32" in out
    assert "[[1.5 1.5 1.5]\n [1.5 1.5 1.5]]" in out
    # The caller's array views the shared memory the server filled.
    assert "zero-copy: owndata=False writeable=False" in out
    assert "arange: dtype=int64 values=[0, 1, 2, 3, 4]" in out


def test_inference() -> None:
    why = torch_import_error()
    if why is not None:
        pytest.skip(f"torch is not importable by {sys.executable}: {why}")
    out = run_example("inference.py")
    assert "model: {'layers': ['Linear', 'ReLU', 'Linear'], 'params': 212}" in out
    assert "infer: input (3, 8) float32 -> output (3, 4) float32" in out
    assert "same input, same output: True" in out


def test_async_task() -> None:
    out = run_example("async_task.py")
    assert re.search(r"^submitted task \S+$", out, re.MULTILINE), out
    assert "state=running" in out  # polled while it ran (6 steps of 50 ms)
    assert "final state: done" in out
    assert "result: {'loss': 0.015625, 'steps': 6}" in out


@pytest.mark.timeout(400 + TIMEOUT + 60)  # Ray's import check (test_ray.TIMEOUT), the example
def test_ray_weights() -> None:
    from tests.test_ray import ray_import_error

    why = torch_import_error() or ray_import_error()
    if why is not None:
        pytest.skip(f"torch or Ray >= 2.60 is not importable by {sys.executable}: {why}")
    out = run_example("ray_weights.py")
    assert "rollout: got (1024, 1024) torch.float32, sum 524288.0" in out
    assert "driver: torch.Size([1024, 1024])" in out


def test_weight_sync() -> None:
    why = torch_import_error()
    if why is not None:
        pytest.skip(f"torch is not importable by {sys.executable}: {why}")
    out = run_example("weight_sync.py")
    for engine in (1, 2):
        got = re.findall(
            rf"^engine {engine}: version (\d) applied"
            r" \((whole|delta): (\d+) of (\d+) bytes sent\)$",
            out,
            re.MULTILINE,
        )
        assert [(v, kind) for v, kind, _, _ in got] == [
            ("1", "whole"),
            ("2", "delta"),
            ("3", "delta"),
        ], out
        for _, kind, sent, full in got:
            # The whole version first; then 1% of the elements changed: a few percent sent.
            assert int(sent) == int(full) if kind == "whole" else int(sent) < int(full) // 20, out
        assert f"engine {engine}: same storage throughout" in out, out
    assert "trainer: both engines are at version 3" in out, out
