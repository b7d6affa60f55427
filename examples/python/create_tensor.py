"""A function that creates a tensor in shared memory: no copy on the way back.

    python examples/python/create_tensor.py

`ferry.empty(shape, dtype)` (inside a handler) and `ctx.alloc(shape, dtype)` (with a
param annotated `ferry.Context`) allocate the result in the memory the connection
shares with the caller. The handler fills it in place and returns it; the caller gets a read-only
numpy array over those same bytes: nothing is serialized or copied.
"""

from __future__ import annotations

import numpy as np

import ferry

app = ferry.App("create-tensor")


@app.function
def create_tensor(rows: int, cols: int, fill: float = 0.0) -> np.ndarray:
    """A `rows` x `cols` float32 matrix of `fill`, made with `ferry.empty`."""
    out = ferry.empty((rows, cols), "float32")
    out.fill(fill)
    return out


@app.function
def arange(n: int, ctx: ferry.Context) -> np.ndarray:
    """0, 1, ..., n-1 as int64, made with `ctx.alloc` (the call's `ferry.Context`)."""
    out = ctx.alloc((n,), np.int64)
    out[:] = np.arange(n)
    return out


if __name__ == "__main__":
    with ferry.spawn(app) as client:
        t = client.call("create_tensor", {"rows": 2, "cols": 3, "fill": 1.5})
        print(f"create_tensor: {type(t).__name__} shape={t.shape} dtype={t.dtype}")
        print(t)
        # A view of the shared memory the server wrote into, not a copy of it: numpy
        # does not own these bytes, and the view is read-only.
        print(f"zero-copy: owndata={t.flags.owndata} writeable={t.flags.writeable}")
        r = client.call("arange", [5])
        print(f"arange: dtype={r.dtype} values={r.tolist()}")
