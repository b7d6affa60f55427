"""torch's float8 and complex dtypes through a served app, run as a script by
`test_checkpoint_dtypes.py` (in a child process: importing torch in the pytest process
would change how ferry treats tensors in every other test). Prints `PASS <check>` per
check and `PASS all` at the end; any failure raises."""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np
import torch

import ferry

app = ferry.App("checkpoint-dtype-checks")


@app.function
def describe(x: torch.Tensor) -> dict[str, Any]:
    """How a torch handler sees a received tensor."""
    as_f64 = x.to(torch.complex128) if x.is_complex() else x.to(torch.float64)
    return {
        "dtype": str(x.dtype),
        "shape": list(x.shape),
        "values": [[float(v.real), float(v.imag)] for v in as_f64.numpy().astype(complex)],
    }


@app.function
def quantized(n: int, fmt: str) -> torch.Tensor:
    """A float8 result made by torch."""
    return torch.linspace(-2, 2, n).to(getattr(torch, fmt))


@app.function
def rotary(n: int) -> torch.Tensor:
    """A complex result made by torch."""
    return torch.polar(torch.ones(n), torch.arange(n, dtype=torch.float32))


@app.function
def empty_float8(n: int) -> torch.Tensor:
    """`ferry.empty(like="torch")` of a torch float8 dtype: sent without a copy."""
    t = ferry.empty([n], torch.float8_e4m3fn, like="torch")
    assert t.dtype == torch.float8_e4m3fn, t.dtype
    t.copy_(torch.full((n,), 1.5).to(torch.float8_e4m3fn))
    return t


def main() -> int:
    with ferry.spawn(app, timeout=120) as c:
        for fmt, np_type in [
            ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
            ("float8_e5m2", ml_dtypes.float8_e5m2),
        ]:
            x = np.array([1.5, -2.0, 0.25], np_type)
            d = c.call("describe", {"x": x})
            assert d["dtype"] == f"torch.{fmt}" and d["shape"] == [3], d
            assert [v[0] for v in d["values"]] == [1.5, -2.0, 0.25], d
            q = c.call("quantized", [5, fmt])
            want = torch.linspace(-2, 2, 5).to(getattr(torch, fmt))
            assert q.dtype == np.dtype(np_type), q.dtype
            assert q.tobytes() == want.view(torch.uint8).numpy().tobytes(), (q, want)
        print("PASS float8 both ways")
        z = np.array([1 + 2j, -0.5j], np.complex64)
        d = c.call("describe", {"x": z})
        assert d == {"dtype": "torch.complex64", "shape": [2], "values": [[1, 2], [0, -0.5]]}, d
        d = c.call("describe", {"x": z.astype(np.complex128)})
        assert d["dtype"] == "torch.complex128", d
        r = c.call("rotary", [4])
        want_r = torch.polar(torch.ones(4), torch.arange(4, dtype=torch.float32)).numpy()
        assert r.dtype == np.complex64 and np.array_equal(r, want_r), r
        print("PASS complex both ways")
        e = c.call("empty_float8", [6])
        assert e.dtype == np.dtype(ml_dtypes.float8_e4m3fn), e.dtype
        assert e.astype(np.float32).tolist() == [1.5] * 6, e
        print("PASS ferry.empty(like='torch') of float8")
    print("PASS all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
