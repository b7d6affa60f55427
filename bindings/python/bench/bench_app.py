"""The API `bench_server.py` serves from Python: the demo API's `add` and `echo`."""

import numpy as np

import ferry

app = ferry.App("bench")


@app.function
def add(a: float, b: float) -> float:
    """a + b"""
    return a + b


@app.function
def echo(tensor: np.ndarray) -> np.ndarray:
    """Returns the tensor (sent back as it is: no copy)."""
    return tensor
