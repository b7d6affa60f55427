"""A torch tensor from one Ray actor to another, `ray.get(b.consume.remote(a.produce.remote()))`,
through ferry (`ferry.ray`), through Ray's object store, and through Ray's CPU transport (gloo),
same run (`cargo xtask bench-ray`; issue 46 point 4).

    python bench_ray.py [--iters-big N] [--iters-small N] [--json PATH]

Rows: 24.9 MB and 64 B float32 tensors. The producer keeps its tensor and returns it each call
(what a trainer handing out its weights does); the consumer reads its last element. ferry is
measured three times: a tensor torch allocated (copied once per object into a segment of the
producer's pool, which comes back once the object is freed and the consumer let go), the same
with no pool (a new segment per object: its pages' first touch), and one made by
`ferry.ray.empty` (lent with no copy). Prints a table of median and p90 per
round trip, and the ratios the issue sets as targets.

The floor: "Ray actor calls only" passes None through the same two calls (what no transport can
go below). A second table times the transfer inside the actors, the part a transport decides:
for ferry the producer's put (Ray's metadata call: the copy in, if any) and the consumer's fetch
(`host_stats()`'s `put_ns_last` / `fetch_ns_last`), for the object store `ray.put` in the
producer and `ray.get` in the consumer (the object's ref passed inside a list, so that Ray does
not resolve it before the call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import ray
import torch

import ferry.ray

BIG = 24_900_000
SMALL = 64

ferry.ray.register(quic=False)


@ray.remote(enable_tensor_transport=True)
class Producer:
    def __init__(self, nbytes: int, ferry_alloc: bool, pool: bool = True) -> None:
        n = nbytes // 4
        if not pool:
            # This actor's host made now, with no pool: every object gets a new segment
            # (ferry.ray before segments were reused), for the comparison in the same run.
            ferry.ray._get_host(ferry.ray._Config(quic=False, pool_mib=0))
        if ferry_alloc:
            self.t = ferry.ray.empty((n,), torch.float32)
            self.t.copy_(torch.arange(n, dtype=torch.float32))
        else:
            self.t = torch.arange(n, dtype=torch.float32)

    @ray.method(tensor_transport="ferry")
    def produce_ferry(self) -> Any:
        return self.t

    @ray.method(tensor_transport="gloo")
    def produce_gloo(self) -> Any:
        return self.t

    def produce_store(self) -> Any:
        return self.t

    def produce_none(self) -> None:
        return None

    def produce_ref(self) -> tuple[list[Any], float]:
        t0 = time.perf_counter()
        ref = ray.put(self.t)
        return [ref], time.perf_counter() - t0

    def last_put_s(self) -> float:
        return ferry.ray.host_stats()["put_ns_last"] / 1e9

    def ready(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, int]:
        return ferry.ray.host_stats()


@ray.remote(enable_tensor_transport=True)
class Consumer:
    def consume(self, t: Any) -> float:
        return float(t[-1])

    def consume_none(self, t: Any) -> float:
        assert t is None
        return 0.0

    def consume_timed(self, t: Any) -> tuple[float, float]:
        return float(t[-1]), ferry.ray.host_stats()["fetch_ns_last"] / 1e9

    def consume_ref(self, box: tuple[list[Any], float]) -> tuple[float, float, float]:
        refs, put_s = box
        t0 = time.perf_counter()
        t = ray.get(refs[0])
        get_s = time.perf_counter() - t0
        return float(t[-1]), put_s, get_s

    def ready(self) -> int:
        return os.getpid()


def measure(a: Any, b: Any, method: str, nbytes: int, iters: int) -> dict[str, Any]:
    produce = getattr(a, method)
    consume = b.consume_none if method == "produce_none" else b.consume
    want = 0.0 if method == "produce_none" else float(nbytes // 4 - 1)
    for _ in range(3):  # warm: connections, Ray's paths, first-touch of pages
        got = ray.get(consume.remote(produce.remote()), timeout=120)
        assert got == want, (method, got, want)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        got = ray.get(consume.remote(produce.remote()), timeout=120)
        times.append(time.perf_counter() - t0)
        assert got == want, (method, got, want)
    times.sort()
    r = {
        "median_ms": statistics.median(times) * 1e3,
        "p90_ms": times[min(len(times) - 1, int(len(times) * 0.9))] * 1e3,
        "iters": iters,
    }
    # The transfer inside the actors, in a pass of its own (it asks the producer between
    # round trips, which the timed pass above must not).
    sends, recvs = [], []
    for _ in range(iters if method in ("produce_ferry", "produce_store") else 0):
        if method == "produce_ferry":
            got, recv_s = ray.get(b.consume_timed.remote(produce.remote()), timeout=120)
            send_s = ray.get(a.last_put_s.remote(), timeout=120)
        else:
            got, send_s, recv_s = ray.get(b.consume_ref.remote(a.produce_ref.remote()), timeout=120)
        assert got == want, (method, got, want)
        sends.append(send_s)
        recvs.append(recv_s)
    if sends:
        r["inside_send_ms"] = statistics.median(sends) * 1e3
        r["inside_recv_ms"] = statistics.median(recvs) * 1e3
    if method == "produce_ferry":
        r["producer"] = ray.get(a.stats.remote(), timeout=120)
    return r


def row(path: str, nbytes: int, iters: int) -> dict[str, Any]:
    ferry_alloc = path == "ferry (ferry.ray.empty)"
    a = Producer.remote(nbytes, ferry_alloc, path != "ferry (torch, no pool)")
    b = Consumer.remote()
    ray.get([a.ready.remote(), b.ready.remote()], timeout=120)
    method = {
        "ferry (torch tensor)": "produce_ferry",
        "ferry (torch, no pool)": "produce_ferry",
        "ferry (ferry.ray.empty)": "produce_ferry",
        "object store": "produce_store",
        "gloo (Ray RDT)": "produce_gloo",
        "Ray actor calls only": "produce_none",
    }[path]
    try:
        if method == "produce_gloo":
            from ray.experimental.collective import create_collective_group

            create_collective_group([a, b], backend="gloo")
        r = measure(a, b, method, nbytes, iters)
    except Exception as e:  # a transport Ray ships that does not work here: say so
        r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    finally:
        ray.kill(a)
        ray.kill(b)
    return {"path": path, "bytes": nbytes, **r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters-big", type=int, default=30)
    ap.add_argument("--iters-small", type=int, default=300)
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    paths = [
        "ferry (torch tensor)",
        "ferry (torch, no pool)",
        "ferry (ferry.ray.empty)",
        "object store",
        "gloo (Ray RDT)",
    ]
    rows = []
    for nbytes, iters in ((BIG, args.iters_big), (SMALL, args.iters_small)):
        for p in paths:
            r = row(p, nbytes, iters)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    floor = row("Ray actor calls only", 0, args.iters_small)
    rows.append(floor)
    print(json.dumps(floor), file=sys.stderr, flush=True)
    ray.shutdown()
    report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def report(rows: list[dict[str, Any]]) -> None:
    """Prints the tables and ratios of one run's rows (`--json` writes them; `python -c
    'import bench_ray, json; bench_ray.report(json.load(open(PATH)))'` prints them again)."""

    def size(n: int) -> str:
        return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n} B" if n else "None"

    cpus = os.cpu_count()
    print(f"\nray {ray.__version__}, torch {torch.__version__}, {cpus} CPUs; median and p90 of")
    print("ray.get(b.consume.remote(a.produce.remote())) per round trip, one run\n")
    print(f"| {'path':<24} | {'tensor':>8} | {'median ms':>9} | {'p90 ms':>8} | iters |")
    print(f"|{'-' * 26}|{'-' * 9}:|{'-' * 10}:|{'-' * 9}:|------:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['path']:<24} | {size(r['bytes']):>8} | {'failed':>9} | {'':>8} |       |")
            print(f"|   {r['error']}")
            continue
        med, p90, n = r["median_ms"], r["p90_ms"], r["iters"]
        print(f"| {r['path']:<24} | {size(r['bytes']):>8} | {med:9.2f} | {p90:8.2f} | {n:5} |")

    def med(path: str, n: int) -> float | None:
        for r in rows:
            if r["path"] == path and r["bytes"] == n and "median_ms" in r:
                return float(r["median_ms"])
        return None

    print("\nthe transfer inside the actors, median ms (ferry: put in the producer, fetch in the")
    print("consumer; object store: ray.put in the producer, ray.get in the consumer)\n")
    print(f"| {'path':<24} | {'tensor':>8} | {'send ms':>8} | {'receive ms':>10} | {'sum':>7} |")
    print(f"|{'-' * 26}|{'-' * 9}:|{'-' * 9}:|{'-' * 11}:|{'-' * 8}:|")
    inside: dict[tuple[str, int], float] = {}
    for r in rows:
        if "inside_send_ms" in r:
            snd, rcv = r["inside_send_ms"], r["inside_recv_ms"]
            inside[(r["path"], r["bytes"])] = snd + rcv
            print(
                f"| {r['path']:<24} | {size(r['bytes']):>8} | {snd:8.2f} | {rcv:10.2f} "
                f"| {snd + rcv:7.2f} |"
            )
    for r in rows:
        if "producer" in r:
            st = r["producer"]
            print(
                f"\n{r['path']} {size(r['bytes'])}: producer's pool: "
                f"{st.get('segments_created')} segments created, "
                f"{st.get('segments_reused')} reused, {st.get('segments_withheld')} withheld",
                end="",
            )
    print("\n")
    store = med("object store", BIG)
    floor_ms = med("Ray actor calls only", 0)
    if store and floor_ms:
        print(
            f"ceiling: object store at 24.9 MB / Ray actor calls only = {store / floor_ms:.1f}x "
            "(no transport can beat the object store by more in this round trip here)"
        )
    # Ray Direct Transport's own floor: the smallest ferry round trip less ferry's part in it
    # (put and fetch); what is left is Ray's (the owner's metadata hop, its __ray_recv__ task).
    rdt = med("ferry (ferry.ray.empty)", SMALL)
    rdt_in = inside.get(("ferry (ferry.ray.empty)", SMALL))
    if store and rdt and rdt_in is not None:
        print(
            f"ceiling under Ray Direct Transport: object store at 24.9 MB / (ferry.ray.empty 64 B "
            f"{rdt:.2f} ms - ferry's put and fetch in it {rdt_in:.2f} ms) = "
            f"{store / (rdt - rdt_in):.1f}x (Ray's part of any RDT round trip here)"
        )
    store_in = inside.get(("object store", BIG))
    for p in ("ferry (torch tensor)", "ferry (torch, no pool)", "ferry (ferry.ray.empty)"):
        fin = inside.get((p, BIG))
        if store_in and fin:
            print(
                f"{p}: inside the actors, object store / ferry at 24.9 MB = {store_in / fin:.1f}x"
            )
    for p in ("ferry (torch tensor)", "ferry (torch, no pool)", "ferry (ferry.ray.empty)"):
        big, small = med(p, BIG), med(p, SMALL)
        if big and small and store:
            print(
                f"{p}: object store / ferry at 24.9 MB = {store / big:.1f}x (target >= 20x); "
                f"ferry 24.9 MB / ferry 64 B = {big / small:.2f}x (target <= 1.5x)"
            )


if __name__ == "__main__":
    main()
