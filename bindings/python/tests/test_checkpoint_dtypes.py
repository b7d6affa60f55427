"""The checkpoint dtypes (float8 e4m3fn and e5m2, complex64 and complex128) through a
served app: numpy arrays of ml_dtypes' float8 types and numpy's complex types arrive as
such, and go back as such (received, allocated, or copied out); torch's float8 and complex
tensors likewise, in a child process (`checkpoint_dtypes_torch.py`, as `test_torch.py`)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import ferry
from ferry import Tensor
from ferry._tensors import dtype_name
from tests.conftest import ROOT
from tests.test_examples import torch_import_error


def cases() -> list[Any]:
    rng = np.random.default_rng(11)
    every_byte = np.arange(256, dtype=np.uint8)
    c = rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))
    c[0, 0] = complex(np.nan, -np.inf)
    big = rng.standard_normal((256, 64)) + 1j  # 256 KiB as c128: over the inline size
    return [
        pytest.param(every_byte.view(ml_dtypes.float8_e4m3fn), "f8e4m3fn", id="f8e4m3fn"),
        pytest.param(every_byte.view(ml_dtypes.float8_e5m2), "f8e5m2", id="f8e5m2"),
        pytest.param(c.astype(np.complex64), "c64", id="c64"),
        pytest.param(c, "c128", id="c128"),
        pytest.param(big, "c128", id="c128-shm"),
    ]


@pytest.mark.parametrize("x,name", cases())
@pytest.mark.parametrize("method", ["copy_of", "alloc_copy", "echo"])
def test_round_trip(client: ferry.Client, x: np.ndarray, name: str, method: str) -> None:
    r = client.call(method, [x])
    assert r.dtype == x.dtype and r.shape == x.shape
    assert r.tobytes() == x.tobytes()  # (bitwise: NaNs included)
    info = client.call("inspect_array", [np.ones(3, x.dtype)])  # (its sum must be JSON)
    assert info["dtype"] == str(x.dtype)  # the handler gets the same numpy type
    assert info["writeable"] is False and info["sum"] == 3.0


def test_float8_raw_bits_arrive_as_ml_dtypes(client: ferry.Client) -> None:
    bits = np.array([0x38, 0xC0, 0x7E], np.uint8)  # 1, -2, 448 as e4m3fn
    info = client.call("inspect_array", [Tensor(bits, "f8e4m3fn")])
    assert info["dtype"] == "float8_e4m3fn" and info["sum"] == 447.0


def test_float8_results_computed_by_the_handler(client: ferry.Client) -> None:
    x = np.array([1.0, -2.0, 0.5], ml_dtypes.float8_e5m2)
    r = client.call("scale", [x])  # ferry.empty(x.shape, x.dtype) then np.multiply
    assert r.dtype == x.dtype and r.astype(np.float32).tolist() == [2.0, -4.0, 1.0]


def test_dtype_names() -> None:
    assert dtype_name("f8e4m3fn") == "f8e4m3fn"
    assert dtype_name("float8_e4m3fn") == "f8e4m3fn"
    assert dtype_name("float8_e5m2") == "f8e5m2"
    assert dtype_name(ml_dtypes.float8_e4m3fn) == "f8e4m3fn"
    assert dtype_name(np.dtype(ml_dtypes.float8_e5m2)) == "f8e5m2"
    assert dtype_name(np.complex64) == "c64"
    assert dtype_name("complex128") == "c128"
    assert dtype_name(ml_dtypes.bfloat16) == "bf16"


def test_torch_checkpoint_dtypes() -> None:
    why = torch_import_error()
    if why is not None:
        pytest.skip(f"torch is not importable by {sys.executable}: {why}")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "checkpoint_dtypes_torch.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS all" in out.stdout, out.stdout + out.stderr
