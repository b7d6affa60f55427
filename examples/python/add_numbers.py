"""Serve a plain Python function and call it from another process.

    python examples/python/add_numbers.py

`ferry.spawn(app)` starts the app in a child process (this file, imported under another
`__name__`, so the block at the bottom runs only here) and hands back a connected
`ferry.Client`. Params go by name (a dict) or by position (a list); they are validated
against the function's type hints, and a wrong one is answered with `Invalid params`.
"""

from __future__ import annotations

import ferry

app = ferry.App("add-numbers")


@app.function
def add(a: float, b: float) -> float:
    """Adds two numbers."""
    return a + b


if __name__ == "__main__":
    with ferry.spawn(app) as client:
        print("add(a=2, b=3) =", client.call("add", {"a": 2, "b": 3}))
        print("add(1.5, 2.25) =", client.call("add", [1.5, 2.25]))
        try:
            client.call("add", {"a": "two", "b": 3})
        except ferry.RpcError as e:
            print("add(a='two', b=3) ->", e.code, e.message)
