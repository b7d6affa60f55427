"""torch from served functions, with a real torch (`tests/torch_app.py`, in a child)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_examples import torch_import_error

CHECKS = [
    "in-place write into a received tensor: private copy, no crash",
    "bf16 arrives as torch.bfloat16",
    "ferry.empty(like='torch') result",
    "a bf16 torch result",
]


def test_torch_handlers() -> None:
    why = torch_import_error()
    if why is not None:
        pytest.skip(f"torch is not importable by {sys.executable}: {why}")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "torch_app.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for check in CHECKS:
        assert f"PASS {check}" in out.stdout, out.stdout + out.stderr
