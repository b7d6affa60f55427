"""`ferry.ray` moving CUDA torch tensors between Ray actors on a real GPU, then a
benchmark of the same transfer through ferry, Ray's own CUDA_IPC transport and Ray's
object store.

Not a pytest module and not run in CI (CI has no GPU, and the simulated GPU lives in one
process while Ray's actors are several: `tests/test_tensor_host_cuda.py` checks the same
host on the simulated GPU). Run it where a GPU is lent, with the `ferry-tensors` package,
Ray >= 2.60 and torch with CUDA:

    python tests/gpu/check_ray_cuda.py local    # same node: cuda-ipc, then the benchmark
    python tests/gpu/check_ray_cuda.py remote   # force_remote=True: QUIC and a host copy

Two actors share the GPU (`num_gpus=0.25` each; a third, killed, starts beside them).
Prints `ok` / `FAIL` per check, a summary, and (local) the benchmark's table: p50 and p99 of
`ray.get(b.consume.remote(a.produce.remote()))` for a 64 B and an f32[1920,1080,3]
tensor, the paths interleaved in rounds. Exit status 0: every check passed.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import time
from typing import Any

import ray
import torch

import ferry.ray

WAIT = 60.0
MODE = sys.argv[1] if len(sys.argv) > 1 else "local"
BIG = 1920 * 1080 * 3
SMALL = 16
ROUNDS = int(os.environ.get("ROUNDS", "5"))
PER_ROUND = int(os.environ.get("PER_ROUND", "10"))

# Before the classes: `@ray.method(tensor_transport="ferry")` checks the name at once.
ferry.ray.register(force_remote=MODE == "remote")


def digest(t: Any) -> str:
    return hashlib.sha256(
        t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
    ).hexdigest()


@ray.remote(num_gpus=0.25, enable_tensor_transport=True)
class Producer:
    def __init__(self) -> None:
        g = torch.Generator(device="cuda").manual_seed(1)
        self.t = {
            "big": torch.randn(BIG, device="cuda", generator=g),
            "small": torch.arange(SMALL, dtype=torch.float32, device="cuda"),
        }

    def digests(self) -> dict[str, str]:
        return {k: digest(v) for k, v in self.t.items()}

    @ray.method(tensor_transport="ferry")
    def ferry(self, size: str) -> Any:
        return self.t[size]

    @ray.method(tensor_transport="cuda_ipc")
    def ipc(self, size: str) -> Any:
        return self.t[size]

    def store(self, size: str) -> Any:
        return self.t[size]

    @ray.method(tensor_transport="ferry")
    def several(self) -> dict[str, Any]:
        base = torch.arange(64 * 48, dtype=torch.float32, device="cuda").reshape(64, 48)
        return {
            "bf16": torch.linspace(-3, 3, 4096, device="cuda").to(torch.bfloat16),
            "i64": torch.arange(1000, dtype=torch.int64, device="cuda") * 7,
            "transposed": base.t(),
        }

    @ray.method(tensor_transport="ferry")
    def on_a_stream(self) -> Any:
        # Written on a stream of its own, after a delay on it: the consumer must see the
        # writes (ferry waits for the producer's stream).
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)
            return torch.full((1 << 20,), 7.0, device="cuda")

    def stats(self) -> dict[str, int]:
        return ferry.ray.host_stats()

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_gpus=0.25, enable_tensor_transport=True)
class Consumer:
    def check(self, t: Any) -> tuple[bool, str, str]:
        return bool(t.is_cuda), str(t.dtype), digest(t)

    def check_many(self, d: dict[str, Any]) -> dict[str, tuple[bool, str, str]]:
        return {k: (bool(v.is_cuda), str(v.dtype), digest(v)) for k, v in d.items()}

    def full_of_sevens(self, t: Any) -> bool:
        return bool(t.is_cuda) and bool((t == 7.0).all())

    def consume(self, t: Any) -> int:
        return int(t.shape[0])

    def stats(self) -> dict[str, int]:
        return ferry.ray.host_stats()

    def gpu_used(self) -> int:
        free, total = torch.cuda.mem_get_info()
        return int(total - free)


results: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    results.append((name, bool(ok), detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name} {'' if ok else detail}", flush=True)


def until(probe: Any, want: Any) -> Any:
    deadline = time.monotonic() + WAIT
    v = probe()
    while not want(v) and time.monotonic() < deadline:
        time.sleep(0.1)
        v = probe()
    return v


def checks(a: Any, b: Any) -> None:
    want = ray.get(a.digests.remote(), timeout=WAIT)
    for size in ("small", "big"):
        is_cuda, dtype, d = ray.get(b.check.remote(a.ferry.remote(size)), timeout=WAIT)
        check(f"{size}: arrives as a CUDA tensor", is_cuda, dtype)
        check(f"{size}: every byte", d == want[size])
    got = ray.get(b.check_many.remote(a.several.remote()), timeout=WAIT)
    check("bf16, i64 and a transposed view: all CUDA", all(v[0] for v in got.values()), str(got))
    check("bf16 stays bf16", got["bf16"][1] == "torch.bfloat16", got["bf16"][1])
    expect = {
        "bf16": digest(torch.linspace(-3, 3, 4096, device="cuda").to(torch.bfloat16)),
        "i64": digest(torch.arange(1000, dtype=torch.int64, device="cuda") * 7),
        "transposed": digest(
            torch.arange(64 * 48, dtype=torch.float32, device="cuda").reshape(64, 48).t()
        ),
    }
    check("their bytes", all(got[k][2] == expect[k] for k in expect), str(got))
    check(
        "a tensor written on another stream is complete",
        ray.get(b.full_of_sevens.remote(a.on_a_stream.remote()), timeout=WAIT),
    )
    ps, cs = ray.get(a.stats.remote()), ray.get(b.stats.remote())
    if MODE == "local":
        check(
            "same node: fetched over the unix socket (cuda-ipc)", cs["fetched_unix"] >= 4, str(cs)
        )
        check("no copy through the host", ps["device_host_copies"] == 0, str(ps))
    else:
        check("forced remote: fetched over QUIC", cs["fetched_quic"] >= 4, str(cs))
        check(
            "a host copy on the producer, moved to the consumer's GPU",
            ps["device_host_copies"] >= 4 and cs["fetched_to_device"] >= 4,
            f"{ps} {cs}",
        )
    # Garbage collection: every ref above is gone, so the producer holds nothing.
    ps = until(lambda: ray.get(a.stats.remote()), lambda s: s["objects"] == 0)
    check("garbage_collect: the producer holds no object", ps["objects"] == 0, str(ps))
    # No growth over many transfers (GPU memory, device-wide).
    for _ in range(20):
        ray.get(b.consume.remote(a.ferry.remote("big")), timeout=WAIT)
    before = ray.get(b.gpu_used.remote())
    for _ in range(200):
        ray.get(b.consume.remote(a.ferry.remote("big")), timeout=WAIT)
    after = until(lambda: ray.get(b.gpu_used.remote()), lambda u: u - before <= 64 << 20)
    check(
        "200 more 24.9 MB transfers leave GPU memory where it was (64 MiB slack)",
        after - before <= 64 << 20,
        f"{(after - before) / 2**20:.1f} MiB more",
    )


def producer_death(b: Any) -> None:
    a = Producer.remote()
    ref = a.ferry.remote("big")
    ready, _ = ray.wait([ref], timeout=WAIT)
    check("the producer to kill ran", bool(ready))
    ray.kill(a)
    time.sleep(1.0)
    t0 = time.monotonic()
    try:
        ray.get(b.check.remote(ref), timeout=30)
        check("a dead producer: an error", False, "the fetch succeeded")
    except Exception as e:
        dt = time.monotonic() - t0
        check(
            f"a dead producer: an error within 20 s ({type(e).__name__}, {dt:.1f} s)",
            dt < 20,
            str(e)[:300],
        )


def bench(a: Any, b: Any) -> None:
    paths = {"ferry": a.ferry, "ray CUDA_IPC": a.ipc, "ray object store": a.store}
    times: dict[tuple[str, str], list[float]] = {
        (p, s): [] for p in paths for s in ("small", "big")
    }
    for m in paths.values():  # warm-up
        for s in ("small", "big"):
            for _ in range(3):
                ray.get(b.consume.remote(m.remote(s)), timeout=WAIT)
    for _ in range(ROUNDS):
        for p, m in paths.items():
            for s in ("small", "big"):
                for _ in range(PER_ROUND):
                    t0 = time.perf_counter()
                    ray.get(b.consume.remote(m.remote(s)), timeout=WAIT)
                    times[(p, s)].append(time.perf_counter() - t0)

    def q(v: list[float], f: float) -> float:
        v = sorted(v)
        return v[min(len(v) - 1, int(f * len(v)))] * 1e3

    print(f"\n{'path':<18} {'tensor':<18} {'p50 ms':>8} {'p99 ms':>8}  n")
    for (p, s), v in times.items():
        name = "f32[1920,1080,3]" if s == "big" else "f32[16] (64 B)"
        print(f"{p:<18} {name:<18} {statistics.median(v) * 1e3:8.2f} {q(v, 0.99):8.2f}  {len(v)}")
    med = {k: statistics.median(v) for k, v in times.items()}
    ferry_big, ferry_small = med[("ferry", "big")], med[("ferry", "small")]
    print(f"object store / ferry at 24.9 MB: {med[('ray object store', 'big')] / ferry_big:.1f}x")
    print(f"CUDA_IPC / ferry at 24.9 MB: {med[('ray CUDA_IPC', 'big')] / ferry_big:.2f}x")
    print(f"ferry 24.9 MB / ferry 64 B: {ferry_big / ferry_small:.2f}x")


def main() -> int:
    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, log_to_driver=True)
    a, b = Producer.remote(), Consumer.remote()
    ray.get([a.pid.remote(), b.stats.remote()], timeout=WAIT)
    try:
        checks(a, b)
        if MODE == "local":
            producer_death(b)
    except Exception as e:
        check("the checks ran", False, f"{type(e).__name__}: {e}"[:2000])
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"{MODE}: {len(results) - failed} passed, {failed} failed", flush=True)
    if MODE == "local" and not failed:
        bench(a, b)
    ray.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
