"""A real torch model through the tensor store, run as a script by `test_store_torch.py` (in a
child process: importing torch in the pytest process would change how ferry treats tensors in
every other test).

    python store_torch_checks.py FERRY_BIN WORKDIR

A tiny transformer block (bf16 and f32 parameters, a persistent buffer) is saved with
`safetensors.torch.save_file`, published by `ferry serve-weights`, opened with
`ferry.open_weights(..., as_torch=True)` and loaded with `load_state_dict(assign=True)`
into a copy made on the meta device. Prints `PASS <check>` per check; any failure raises.
`python store_torch_checks.py --reader ADDR NAME FILE` is the second reader (another process).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ferry import open_weights

WAIT = 60.0
"""Seconds any wait gives up after (a failure, never a measurement)."""

NAME = "tiny"


class Block(nn.Module):
    """Embedding (bf16), causal self-attention (f32), MLP (bf16), head (f32), and a learned-
    looking positional table kept as a persistent buffer (f32)."""

    def __init__(self, vocab: int = 64, d: int = 32, heads: int = 4, ctx: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d, dtype=torch.bfloat16)
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d, dtype=torch.bfloat16),
            nn.GELU(),
            nn.Linear(4 * d, d, dtype=torch.bfloat16),
        )
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("pos", torch.randn(ctx, d))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        pos = self.get_buffer("pos")
        x = self.embed(ids).float() + pos[:t]
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        x = x + self.mlp(self.norm2(x).bfloat16()).float()
        out: torch.Tensor = self.head(x)
        return out


def memfd_ranges() -> list[tuple[int, int]]:
    """This process's mappings of memfds (shared memory received from a server)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/memfd:"):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi))
    return out


def mapping_of(t: torch.Tensor, ranges: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The memfd mapping holding all of `t`'s bytes, if any."""
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    return next(((lo, hi) for lo, hi in ranges if lo <= start and end <= hi), None)


def same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return sorted(got) == sorted(want) and all(
        got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want
    )


def serve(ferry: str, path: Path, addr: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [ferry, "serve-weights", str(path), "--name", NAME, "--addr", addr],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], WAIT)
    line = proc.stdout.readline() if ready else b""
    if not line.startswith(b"listening on"):
        proc.kill()
        proc.wait(WAIT)
        raise AssertionError(f"ferry serve-weights did not start (got {line!r})")
    return proc


def reader(addr: str, name: str, path: str) -> int:
    """The second reader: what the store serves is still exactly the checkpoint."""
    b = open_weights(addr, name, as_torch=True)
    try:
        assert same_tensors(b.state_dict(), load_file(path)), "the store's tensors changed"
    finally:
        b.close()
    print("same")
    return 0


def main(ferry: str, workdir: Path) -> int:
    torch.manual_seed(0)
    model = Block().eval()
    path = workdir / "tiny.safetensors"
    save_file(model.state_dict(), str(path))
    want = load_file(str(path))
    dtypes = {str(t.dtype) for t in want.values()}
    assert dtypes == {"torch.bfloat16", "torch.float32"}, dtypes
    ids = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        expected = model(ids)

    addr = f"unix:ferry-store-torch-{os.getpid()}"
    server = serve(ferry, path, addr)
    try:
        bundle = open_weights(addr, NAME, as_torch=True)
        sd = bundle.state_dict()
        with torch.device("meta"):
            loaded = Block()
        loaded.load_state_dict(sd, assign=True)
        loaded.eval()
        tensors = dict(loaded.named_parameters()) | dict(loaded.named_buffers())
        assert sorted(tensors) == sorted(want), (sorted(tensors), sorted(want))
        for k, t in tensors.items():
            assert t.device.type == "cpu" and t.dtype == want[k].dtype, (k, t.device, t.dtype)
            assert t.data_ptr() == sd[k].data_ptr(), f"{k}: load_state_dict copied it"
        assert all(p.requires_grad for p in loaded.parameters())
        with torch.no_grad():
            got = loaded(ids)
        assert torch.equal(got, expected), (got - expected).abs().max()
        print("PASS a model made on the meta device loads the store's tensors: same outputs")

        # Zero copy: every parameter and buffer lies in one mapping of the server's bucket
        # (the checkpoint file is one bucket), not in memory of this process's own.
        ranges = memfd_ranges()
        holding = {k: mapping_of(t, ranges) for k, t in tensors.items()}
        assert None not in holding.values(), [k for k, m in holding.items() if m is None]
        assert len(set(holding.values())) == 1, set(holding.values())
        assert mapping_of(loaded.qkv.weight.detach().clone(), ranges) is None, "a copy is not"
        print("PASS every parameter and buffer is a view of the one mapped bucket")

        # An optimizer step writes into the parameters in place: pages are copied for this
        # process only (the bucket is mapped copy-on-write).
        before = {k: t.detach().clone() for k, t in tensors.items()}
        ptrs = {k: t.data_ptr() for k, t in tensors.items()}
        loaded.train()
        opt = torch.optim.SGD(loaded.parameters(), lr=0.5)
        loss = F.cross_entropy(loaded(ids).flatten(0, 1), torch.roll(ids, -1, 1).flatten())
        torch.autograd.backward(loss)
        opt.step()
        moved = [k for k, p in loaded.named_parameters() if not torch.equal(p, before[k])]
        assert sorted(moved) == sorted(dict(loaded.named_parameters())), moved
        assert {k: t.data_ptr() for k, t in tensors.items()} == ptrs, "a parameter moved"
        assert torch.equal(bundle["qkv.weight"], loaded.qkv.weight), "the step wrote in place"
        print("PASS an optimizer step writes the loaded parameters in place")

        again = open_weights(addr, NAME, as_torch=True)
        assert same_tensors(again.state_dict(), want), "the write reached another connection"
        with torch.device("meta"):
            fresh = Block()
        fresh.load_state_dict(again.state_dict(), assign=True)
        with torch.no_grad():
            assert torch.equal(fresh.eval()(ids), expected)
        again.close()
        other = subprocess.run(
            [sys.executable, __file__, "--reader", addr, NAME, str(path)],
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
        assert other.returncode == 0 and other.stdout.strip() == "same", other
        print("PASS a write to a loaded parameter is not seen by other readers")
        bundle.close()
    finally:
        server.kill()
        server.wait(WAIT)
        if server.stdout is not None:
            server.stdout.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--reader":
        sys.exit(reader(*sys.argv[2:5]))
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
