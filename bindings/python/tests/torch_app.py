"""A torch app and its checks, run as a script by `test_torch.py` (in a child process:
importing torch in the pytest process would change how ferry treats tensors in every
other test). Prints `PASS <check>` per check; any failure raises."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

import ferry
from ferry import Tensor

app = ferry.App("torch-checks")


@app.function
def double_in_place(x: torch.Tensor) -> torch.Tensor:
    """Writes into the received tensor (torch has no read-only tensors)."""
    x.mul_(2)
    return x


@app.function
def describe(x: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(x.dtype), "shape": list(x.shape), "sum": float(x.float().sum())}


@app.function
def arange(n: int) -> torch.Tensor:
    t = ferry.empty([n], "f32", like="torch")
    t.copy_(torch.arange(n, dtype=torch.float32))
    return t


@app.function
def halves(n: int) -> torch.Tensor:
    return torch.full((n,), 0.5, dtype=torch.bfloat16)


def main() -> int:
    with ferry.spawn(app, timeout=120) as c:
        # 1 MiB: over the inline threshold, so the server maps the caller's memory.
        # The same memory of the caller's pool is reused by each call: pages the server
        # wrote must not hide the next call's bytes.
        for i in range(4):
            x = np.arange(1 << 18, dtype=np.float32) + i
            keep = x.copy()
            y = c.call("double_in_place", {"x": x})
            assert np.array_equal(y, keep * 2), ("the in-place result is wrong", i, y[:3])
            assert np.array_equal(x, keep), "the server's write reached the caller's memory"
            sent = c.alloc(x.shape, "f32")
            sent[...] = keep
            y = c.call("double_in_place", {"x": sent})
            assert np.array_equal(y, keep * 2), ("in-place on allocated memory", i, y[:3])
            assert np.array_equal(sent, keep), "the server's write reached the caller's pool"
        print("PASS in-place write into a received tensor: private copy, no crash")
        bits = (np.full(4, 1.5, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        d = c.call("describe", {"x": Tensor(bits, "bf16")})
        assert d == {"dtype": "torch.bfloat16", "shape": [4], "sum": 6.0}, d
        print("PASS bf16 arrives as torch.bfloat16")
        a = c.call("arange", [1 << 16])
        assert a.dtype == np.float32 and np.array_equal(a, np.arange(1 << 16, dtype=np.float32))
        print("PASS ferry.empty(like='torch') result")
        h = c.call("halves", [8])
        assert h.dtype.itemsize == 2 and h.shape == (8,), (h.dtype, h.shape)
        assert np.all(h.view(np.uint16) == 0x3F00), h
        print("PASS a bf16 torch result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
