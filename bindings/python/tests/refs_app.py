"""An app whose functions answer with tensor references (`Context.keep`, `ferry.keep`),
for `test_refs.py`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pydantic

import ferry
from ferry import TensorRef
from tests.apps import mapping_of

app = ferry.App("reftest", description="Tensor references from Python.")


@app.function
def embed(n: int, ctx: ferry.Context, ttl: float | None = None) -> TensorRef:
    """0, 1, ... n-1 as f32, kept on the server."""
    return ctx.keep(np.arange(n, dtype=np.float32), ttl=ttl)


@app.function
def pair(n: int) -> dict[str, TensorRef]:
    """Two references in a typed dict, kept with `ferry.keep` (no Context param)."""
    grid = np.arange(2 * n, dtype=np.float64).reshape(2, n)
    return {"grid": ferry.keep(grid), "ones": ferry.keep(np.ones(n, dtype=np.int16))}


class Kept(pydantic.BaseModel):
    """A model with a reference field."""

    ref: TensorRef
    note: str


@app.function
def model(n: int) -> Kept:
    return Kept(ref=ferry.keep(np.full(n, 7, dtype=np.uint8)), note="sevens")


@app.function
def loose(n):  # type: ignore[no-untyped-def]  # unannotated: the result is encoded as it is
    return {"ref": ferry.keep(np.ones(n, dtype=np.float32)), "n": n}


@app.function
def where(x: np.ndarray) -> dict[str, Any]:
    """How a received tensor looks: a reference param arrives as the kept tensor."""
    return {
        "ptr": int(x.__array_interface__["data"][0]),
        "mapping": mapping_of(x),
        "writeable": bool(x.flags.writeable),
        "dtype": str(x.dtype),
        "shape": list(x.shape),
        "sum": float(np.asarray(x, dtype=np.float64).sum()),
    }


@app.function
def keep_many(n: int, k: int) -> list[TensorRef]:
    """`k` references (past the server's `max_refs`, the caller gets LIMIT_EXCEEDED)."""
    return [ferry.keep(np.zeros(n, dtype=np.float32)) for _ in range(k)]


@app.function
def keep_caught(n: int, k: int) -> str:
    """Keeps until the limit refuses, and says what it said."""
    try:
        for _ in range(k):
            ferry.keep(np.zeros(n, dtype=np.float32))
    except ferry.RpcError as e:
        return f"{e.code}: {e.message}: {e.data}"
    return "no limit"
