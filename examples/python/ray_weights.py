"""ferry under Ray: a trainer actor hands its weights to a rollout actor through ferry.

    pip install "ferry-tensors[ray]" torch
    python examples/python/ray_weights.py

`ferry.ray.register()` adds the `ferry` tensor transport to Ray; a method marked
`@ray.method(tensor_transport="ferry")` returns tensors that stay in the producing actor's
shared memory, and the actor that gets the ObjectRef maps them (same node: zero-copy,
read-only; another node: QUIC). The weights here come from `ferry.ray.empty`, so they are
lent with no copy at all.
"""

from __future__ import annotations

import ray
import torch

import ferry.ray

ferry.ray.register()  # before the actor classes: Ray checks the transport's name there


@ray.remote(enable_tensor_transport=True)
class Trainer:
    def __init__(self) -> None:
        self.w = ferry.ray.empty((1024, 1024), torch.float32)  # 4 MiB in ferry's memory
        self.w.fill_(0.5)

    @ray.method(tensor_transport="ferry")
    def weights(self) -> torch.Tensor:
        return self.w


@ray.remote(enable_tensor_transport=True)
class Rollout:
    def load(self, w: torch.Tensor) -> str:
        return f"got {tuple(w.shape)} {w.dtype}, sum {float(w.sum()):.1f}"


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    trainer, rollout = Trainer.remote(), Rollout.remote()
    print("rollout:", ray.get(rollout.load.remote(trainer.weights.remote())))
    print("driver:", ray.get(trainer.weights.remote()).shape)
    ray.shutdown()
