"""A real torch model through the tensor store (`ferry serve-weights`, `ferry.open_weights`
with `as_torch=True`): `tests/store_torch_checks.py`, in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_examples import torch_import_error

CHECKS = [
    "a model made on the meta device loads the store's tensors: same outputs",
    "every parameter and buffer is a view of the one mapped bucket",
    "an optimizer step writes the loaded parameters in place",
    "a write to a loaded parameter is not seen by other readers",
]


def ferry_bin() -> str:
    """`$FERRY_BIN` (CI sets it), else this checkout's `target/{debug,release}/ferry`."""
    env = os.environ.get("FERRY_BIN")
    if env:
        return env
    for profile in ("debug", "release"):
        candidate = ROOT.parents[1] / "target" / profile / "ferry"
        if candidate.exists():
            return str(candidate)
    pytest.fail("no ferry binary: build it with `cargo build -p ferry-cli` or set FERRY_BIN")


def test_a_torch_model_loads_from_the_store(tmp_path: Path) -> None:
    why = torch_import_error()
    if why is not None:
        pytest.skip(f"torch is not importable by {sys.executable}: {why}")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "store_torch_checks.py"), ferry_bin(), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for check in CHECKS:
        assert f"PASS {check}" in out.stdout, out.stdout + out.stderr
