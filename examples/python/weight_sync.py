"""Weight sync: a trainer publishes a version every step; two engines follow by deltas.

    python examples/python/weight_sync.py

The trainer (this process) hosts a store on QUIC (`ferry.StoreServer`, loopback here; a
pinned certificate and a token, as across hosts) and publishes its model's `state_dict`
each step. Each engine is a process of its own (this file run with `engine N`): it
subscribes, waits for each version and writes it into its own model in place
(`apply_to`: every parameter keeps its storage). The first version comes whole; after a
step that changed 1% of the elements, each engine is sent only those (a sparse delta, a
few percent of the bytes), checked against the version's BLAKE3 digests before a byte of
the model is written.
"""

from __future__ import annotations

import subprocess
import sys

import torch

import ferry
import ferry.weights

STEPS = 3
TOKEN = "example-token"


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 64)).to(
        torch.bfloat16
    )


def engine(index: int, addr: str) -> None:
    model = make_model()
    ptrs = [p.data_ptr() for p in model.parameters()]
    sub = ferry.weights.subscribe(addr, "policy", token=TOKEN)
    for version in range(1, STEPS + 1):
        sub.wait_for(version, timeout=60)
        sub.apply_to(model)
        u = sub.last_update
        kind = "whole" if u["dense"] and not u["sparse"] else "delta"
        print(
            f"engine {index}: version {sub.version} applied ({kind}:"
            f" {u['sent_bytes']} of {u['full_bytes']} bytes sent)",
            flush=True,
        )
    assert ptrs == [p.data_ptr() for p in model.parameters()], "storage moved"
    print(f"engine {index}: same storage throughout", flush=True)


def trainer() -> None:
    torch.manual_seed(0)
    model = make_model()
    with ferry.StoreServer("quic://127.0.0.1:0", token=TOKEN) as store:
        publisher = ferry.weights.Publisher(store, "policy")
        engines = [
            subprocess.Popen(
                [sys.executable, __file__, "engine", str(i), store.addr],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in (1, 2)
        ]
        try:
            for version in range(1, STEPS + 1):
                if version > 1:  # a "training step": 1% of each tensor's elements change
                    with torch.no_grad():
                        for p in model.parameters():
                            flat = p.view(-1)
                            idx = torch.randperm(flat.numel())[: flat.numel() // 100]
                            flat[idx] += 0.5
                publisher.publish(model.state_dict(), version=version)
                print(f"trainer: published version {version}", flush=True)
                # (Here the trainer waits for both engines before its next step, so that
                # each step's delta shows; a real trainer goes on at once.)
                for e in engines:
                    assert e.stdout is not None
                    print(e.stdout.readline(), end="", flush=True)
            for e in engines:
                assert e.stdout is not None
                print(e.stdout.read(), end="", flush=True)
                if e.wait(timeout=90) != 0:
                    raise SystemExit(f"an engine exited {e.returncode}")
        finally:
            for e in engines:
                e.kill()
                e.wait()
    print("trainer: both engines are at version", STEPS)


if __name__ == "__main__":
    if sys.argv[1:2] == ["engine"]:
        engine(int(sys.argv[2]), sys.argv[3])
    else:
        trainer()
