"""Model inference in a server process: the model lives there, callers send inputs.

    python examples/python/inference.py        # needs torch (CPU is enough)

The server process owns a small torch model (built once, on its first call). `infer`
is annotated `x: torch.Tensor`, so the numpy array a client sends arrives as a torch
tensor over the shared memory (no copy); the torch tensor it returns goes back as a
numpy array.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

import ferry

app = ferry.App("inference")


@functools.cache
def model() -> nn.Module:
    """The model, built on first use: only the server process ever builds it."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return m.eval()


@app.function
def infer(x: torch.Tensor) -> torch.Tensor:
    """The model's output for a batch `x` of shape (batch, 8), float32."""
    with torch.inference_mode():
        return model()(x)


@app.function
def info() -> dict[str, object]:
    """What the model is: its layers and its parameter count."""
    m = model()
    return {
        "layers": [type(layer).__name__ for layer in m],
        "params": sum(p.numel() for p in m.parameters()),
    }


if __name__ == "__main__":
    with ferry.spawn(app) as client:
        print("model:", client.call("info"))
        x = np.random.default_rng(0).standard_normal((3, 8), dtype=np.float32)
        y = client.call("infer", [x])
        print(f"infer: input {x.shape} {x.dtype} -> output {y.shape} {y.dtype}")
        print(np.round(y, 4))
        again = client.call("infer", [x])
        print("same input, same output:", bool(np.array_equal(y, again)))
