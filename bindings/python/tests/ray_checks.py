"""ferry as Ray's tensor transport (`ferry.ray`), run as a script by `test_ray.py` (in a child
process: Ray and torch imported in the pytest process would change how ferry treats tensors in
every other test, and a process runs one Ray instance).

    python ray_checks.py one-node     # ray.init(num_cpus=2): the same-host path
    python ray_checks.py two-nodes    # ray.cluster_utils.Cluster, 2 nodes, force_remote=True

Prints `PASS <check>` per check; the first failure raises (exit status 1). Every wait is
bounded; nothing here measures time.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import ray
import torch

import ferry
import ferry.ray

WAIT = 60.0
"""Seconds any wait gives up after (a failure, never a measurement)."""

TRANSFERS = 1000
"""Transfers of the leak check."""

RSS_SLACK = 32 << 20
"""How far a process's RSS may end above where it started, in bytes (Ray's own per-task
records and Python's allocator; a leak of the 64 B tensors' segments would be one 4 KiB
page or more per transfer, and the mappings are counted exactly)."""


POOL_IDLE = 4.0
"""`register(pool_idle=)` of the one-node checks: seconds an idle kept segment waits."""

MODE = sys.argv[1] if len(sys.argv) > 1 else "one-node"
TOKEN = "ferry-ray-checks-token"
# Before the classes: `@ray.method(tensor_transport="ferry")` checks the name is registered.
if MODE == "two-nodes":
    ferry.ray.register(force_remote=True, token=TOKEN)
else:
    ferry.ray.register(pool_idle=POOL_IDLE)


def check(name: str, ok: bool, detail: object = "") -> None:
    if not ok:
        raise AssertionError(f"FAIL {name}: {detail}")
    print(f"PASS {name}", flush=True)
    if detail != "":
        print(f"    {detail!r:.300}", flush=True)


def wait_for(what: str, probe: Any, until: Any) -> Any:
    """Calls `probe()` until `until(value)` holds; the value. Fails after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while True:
        v = probe()
        if until(v):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"FAIL gave up after {WAIT} s waiting for {what} (last {v!r})")
        time.sleep(0.05)


def footprint() -> dict[str, Any]:
    """This process's RSS, its memfd mappings, and the names in /dev/shm."""
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    with open("/proc/self/maps") as f:
        memfd = sum(1 for line in f if "/memfd:" in line)
    return {"rss": rss, "memfd": memfd, "shm": sorted(os.listdir("/dev/shm"))}


def mapping_of(ptr: int) -> str:
    """The /proc/self/maps line whose range holds `ptr`."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= ptr < hi:
                return line.strip()
    return ""


@ray.remote(enable_tensor_transport=True)
class Producer:
    @ray.method(tensor_transport="ferry")
    def produce(self, n: int, seed: float = 0.0) -> Any:
        return torch.arange(n, dtype=torch.float32) + seed

    @ray.method(tensor_transport="ferry")
    def produce_empty(self, n: int) -> Any:
        t = ferry.ray.empty((n,), torch.float32)
        t.copy_(torch.arange(n, dtype=torch.float32))
        return t

    @ray.method(tensor_transport="ferry")
    def produce_many(self) -> Any:
        return {
            "a": torch.arange(6, dtype=torch.int64).reshape(2, 3),
            "b": torch.full((3,), 1.5, dtype=torch.bfloat16),
            "c": torch.ones(4, dtype=torch.float16),
        }

    def stats(self) -> dict[str, int]:
        return ferry.ray.host_stats()

    def footprint(self) -> dict[str, Any]:
        return footprint()

    def where(self) -> dict[str, Any]:
        return dict(ferry.ray._host_desc)

    def node(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


@ray.remote(enable_tensor_transport=True)
class Consumer:
    def consume(self, t: Any) -> float:
        return float(t.sum())

    def inspect(self, t: Any) -> dict[str, Any]:
        return {
            "sum": float(t.sum()),
            "dtype": str(t.dtype),
            "mapping": mapping_of(t.data_ptr()),
        }

    def keep(self, t: Any) -> float:
        self.kept = t
        return float(t.sum())

    def matches(self, t: Any, seed: float) -> bool:
        return bool(torch.equal(t, torch.arange(t.numel(), dtype=torch.float32) + seed))

    def kept_is(self, n: int, seed: float) -> bool:
        return bool(torch.equal(self.kept, torch.arange(n, dtype=torch.float32) + seed))

    def drop_kept(self) -> None:
        del self.kept

    def consume_many(self, d: Any) -> dict[str, Any]:
        return {k: (str(v.dtype), v.float().tolist()) for k, v in d.items()}

    def stats(self) -> dict[str, int]:
        return ferry.ray.host_stats()

    def footprint(self) -> dict[str, Any]:
        return footprint()

    def node(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


@ray.remote
class Plain:
    def consume(self, t: Any) -> float:
        return float(t.sum())


def one_node() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    a, b = Producer.remote(), Consumer.remote()

    got = ray.get(b.inspect.remote(a.produce.remote(1000)), timeout=WAIT)
    check(
        "one node: a tensor reaches the consumer intact",
        got["sum"] == float(sum(range(1000))) and got["dtype"] == "torch.float32",
        got,
    )
    check(
        "one node: the consumer's tensor is a mapping of the producer's memfd (zero-copy)",
        "/memfd:" in got["mapping"],
        got["mapping"],
    )
    st = ray.get(b.stats.remote())
    check(
        "one node: the fetch went over the unix socket",
        st["fetched_unix"] >= 1 and st["fetched_quic"] == 0,
        st,
    )

    before = ray.get(a.stats.remote())["copied_bytes"]
    got = ray.get(b.inspect.remote(a.produce_empty.remote(1 << 16)), timeout=WAIT)
    after = ray.get(a.stats.remote())["copied_bytes"]
    check(
        "one node: a tensor made by ferry.ray.empty is lent without a copy",
        after == before and got["sum"] == float(sum(range(1 << 16))),
        (before, after, got),
    )
    ray.get(b.consume.remote(a.produce.remote(1 << 16)), timeout=WAIT)
    copied = ray.get(a.stats.remote())["copied_bytes"] - after
    check("one node: any other tensor is copied in once", copied == 4 << 16, copied)

    many = ray.get(b.consume_many.remote(a.produce_many.remote()), timeout=WAIT)
    check(
        "one node: several tensors of several dtypes in one object",
        many
        == {
            "a": ("torch.int64", [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]),
            "b": ("torch.bfloat16", [1.5, 1.5, 1.5]),
            "c": ("torch.float16", [1.0, 1.0, 1.0, 1.0]),
        },
        many,
    )

    ref = a.produce.remote(8, 2.0)
    got_driver = ray.get(ref, timeout=WAIT)
    check(
        "one node: ray.get in the driver fetches through ferry",
        got_driver.tolist() == [float(i) + 2.0 for i in range(8)],
        got_driver,
    )
    held = ray.get(a.stats.remote())["objects"]
    check("garbage_collect: the producer holds a live object", held >= 1, held)
    del ref, got_driver
    wait_for(
        "the producer to free every object",
        lambda: ray.get(a.stats.remote())["objects"],
        lambda n: n == 0,
    )
    check("garbage_collect: out-of-scope objects are freed by the producer", True)

    c = Plain.remote()
    try:
        ray.get(c.consume.remote(a.produce.remote(4)), timeout=WAIT)
        check(
            "a receiver without enable_tensor_transport gets an error that says so",
            False,
            "no error",
        )
    except Exception as e:  # RayTaskError(TransportNotEnabled)
        check(
            "a receiver without enable_tensor_transport gets an error that says so",
            isinstance(e, ferry.ray.TransportNotEnabled)
            and "enable_tensor_transport=True" in str(e),
            repr(e)[:500],
        )
    ray.kill(c)

    check_reuse(a, b)

    # 1,000 transfers leave RSS, memfd mappings and /dev/shm where they started.
    for i in range(20):  # warm: pipes connected, Ray's paths taken once
        ray.get(b.consume.remote(a.produce.remote(16, float(i))), timeout=WAIT)
    wait_for(
        "the warm-up's objects to be freed",
        lambda: ray.get(a.stats.remote())["objects"],
        lambda n: n == 0,
    )
    p0, c0 = ray.get(a.footprint.remote()), ray.get(b.footprint.remote())
    total = 0.0
    for i in range(TRANSFERS):
        total += ray.get(b.consume.remote(a.produce.remote(16, float(i))), timeout=WAIT)
    check(
        f"{TRANSFERS} transfers arrive intact",
        total == sum(120.0 + 16.0 * i for i in range(TRANSFERS)),
        total,
    )
    wait_for(
        "the producer to free every object",
        lambda: ray.get(a.stats.remote())["objects"],
        lambda n: n == 0,
    )
    p1 = wait_for(
        "the producer's memfd mappings",
        lambda: ray.get(a.footprint.remote()),
        lambda f: f["memfd"] <= p0["memfd"],
    )
    c1 = wait_for(
        "the consumer's memfd mappings",
        lambda: ray.get(b.footprint.remote()),
        lambda f: f["memfd"] <= c0["memfd"],
    )
    check(
        f"{TRANSFERS} transfers: memfd mappings back where they started",
        True,
        (p0["memfd"], p1["memfd"], c0["memfd"], c1["memfd"]),
    )
    grown = (p1["rss"] - p0["rss"], c1["rss"] - c0["rss"])
    check(f"{TRANSFERS} transfers: RSS back where it started", max(grown) <= RSS_SLACK, grown)
    new_shm = sorted(set(c1["shm"]) - set(c0["shm"]))
    check(f"{TRANSFERS} transfers: nothing new in /dev/shm", not new_shm, new_shm)

    # abort_transport ends a fetch waiting on a producer that does not answer.
    check_abort()

    # The producer dies: the consumer gets ProducerGone, not Ray's 60 s fetch timeout.
    d = Producer.remote()
    ref = d.produce.remote(32)
    ray.wait([ref], timeout=WAIT)
    kill_producer(d)
    try:
        ray.get(b.consume.remote(ref), timeout=WAIT)
    except Exception as e:
        check(
            "a consumer whose producer died gets ProducerGone",
            isinstance(e, ferry.ray.ProducerGone),
            repr(e)[:500],
        )
    else:
        check("a consumer whose producer died gets ProducerGone", False, "no error")
    ray.shutdown()


def check_reuse(a: Any, b: Any) -> None:
    """The producer's pool: a segment is filled again once its object was freed and its
    consumer let go, never while the consumer still holds a tensor from it."""
    n = (1 << 18) + 3  # a size no other check uses

    def stats() -> dict[str, int]:
        return dict(ray.get(a.stats.remote()))

    # From an empty pool (what earlier checks left goes after POOL_IDLE), so that its
    # figures count this check's segments only.
    wait_for("the pool to be empty", stats, lambda st: st["pool_segments"] == 0)
    f0 = ray.get(a.footprint.remote())

    # Object 1 stays in the consumer; object 2 passes and is freed.
    ray.get(b.keep.remote(a.produce.remote(n, 7.0)), timeout=WAIT)
    ray.get(b.consume.remote(a.produce.remote(n, 1.0)), timeout=WAIT)
    s1 = wait_for(
        "object 2's segment to come back",
        stats,
        lambda st: st["objects"] == 0 and st["pool_segments"] >= 1,
    )
    # Object 3 reuses object 2's segment (the only one of its size that came back).
    got = ray.get(b.matches.remote(a.produce.remote(n, 3.0), 3.0), timeout=WAIT)
    s2 = stats()
    check(
        "reuse: a freed object's segment is filled again for the next object of its size",
        s2["segments_reused"] == s1["segments_reused"] + 1 and got,
        (s1, s2, got),
    )
    # Objects 4-6 pass while object 1's tensor is still held.
    for seed in (4.0, 5.0, 6.0):
        ok = ray.get(b.matches.remote(a.produce.remote(n, seed), seed), timeout=WAIT)
        assert ok, f"FAIL object with seed {seed} arrived changed"
    check(
        "reuse: a consumer's held tensor keeps its bytes while later objects of its size pass",
        ray.get(b.kept_is.remote(n, 7.0), timeout=WAIT),
    )
    before = wait_for("objects 3-6 to be freed", stats, lambda st: st["objects"] == 0)
    ray.get(b.drop_kept.remote(), timeout=WAIT)
    after = wait_for(
        "object 1's segment to come back",
        stats,
        # Object 2's segment (filled again by 3-6, then back) and object 1's.
        lambda st: st["pool_segments"] >= 2,
    )
    check(
        "reuse: a held tensor's segment comes back once the consumer drops it",
        after["segments_withheld"] == 0,
        (before, after),
    )
    f1 = wait_for(
        "the pool to give its segments back",
        lambda: (stats(), ray.get(a.footprint.remote())),
        lambda sf: sf[0]["pool_bytes"] == 0 and sf[1]["memfd"] <= f0["memfd"],
    )
    check(
        f"reuse: the pool gives its memory back after pool_idle ({POOL_IDLE} s)",
        f1[0]["segments_given_back"] > after["segments_given_back"],
        (f0["memfd"], f1),
    )


def check_abort() -> None:
    import json
    import threading

    mute = ferry._native.listen(f"unix:ferry-ray-checks-mute-{os.getpid()}")
    accepted: list[Any] = []
    t_accept = threading.Thread(target=lambda: accepted.append(mute.accept(WAIT)))
    t_accept.start()
    node = str(ray.get_runtime_context().get_node_id())
    desc = {"v": 1, "id": "x", "node": node, "pid": 0, "unix": mute.address, "quic": None}
    desc["tensors"] = [{"dtype": "f32", "shape": [4]}]
    meta = ferry.ray.FerryTransportMetadata(
        tensor_meta=[((4,), torch.float32)], tensor_device="cpu", descriptor=json.dumps(desc)
    )
    assert ferry.ray._registered is not None
    mgr = ferry.ray._registered()
    comm = mgr.get_communicator_metadata(None, None, ferry.ray.TRANSPORT)
    outcome: list[BaseException] = []

    def fetch() -> None:
        try:
            mgr.recv_multiple_tensors("abort-me", meta, comm)
        except BaseException as e:
            outcome.append(e)

    t = threading.Thread(target=fetch)
    t.start()
    wait_for("the fetch to be in flight", lambda: "abort-me" in ferry.ray._inflight, bool)
    mgr.abort_transport("abort-me", comm)
    t.join(WAIT)
    t_accept.join(WAIT)
    check(
        "abort_transport ends a fetch in flight with TransferError",
        not t.is_alive()
        and len(outcome) == 1
        and type(outcome[0]) is ferry.ray.TransferError
        and "aborted" in str(outcome[0]),
        outcome,
    )


def _dead(actor: Any) -> bool:
    try:
        ray.get(actor.node.remote(), timeout=5)
        return False
    except Exception:
        return True


def _gone(pid: int) -> bool:
    """Whether process `pid` (on this host) has exited: gone, or a zombie (whose sockets
    are closed)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def kill_producer(d: Any) -> None:
    """Kills producer `d` and waits until it is dead to Ray and its process has exited.
    Ray marks a killed actor dead before its process ends, and a process still running
    answers on its ferry endpoint: a consumer asking then got the tensor (1 run in CI,
    "no error"). Every node of the test's cluster is on this host, so the pid says."""
    pid = int(ray.get(d.where.remote(), timeout=WAIT)["pid"])
    ray.kill(d)
    wait_for("the killed producer to be dead", lambda: _dead(d), lambda x: x)
    wait_for(f"the killed producer's process {pid} to exit", lambda: _gone(pid), lambda x: x)


def two_nodes() -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "resources": {"n1": 4}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"n2": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        a = Producer.options(resources={"n1": 1}).remote()
        near = Consumer.options(resources={"n1": 1}).remote()
        far = Consumer.options(resources={"n2": 1}).remote()
        nodes = ray.get([a.node.remote(), near.node.remote(), far.node.remote()], timeout=WAIT)
        check(
            "two nodes: the producer and the far consumer are on different nodes",
            nodes[0] == nodes[1] != nodes[2],
            nodes,
        )
        got = ray.get(far.inspect.remote(a.produce.remote(1000)), timeout=WAIT)
        st = ray.get(far.stats.remote())
        check(
            "two nodes: a tensor reaches a consumer on another node over QUIC",
            got["sum"] == float(sum(range(1000)))
            and st["fetched_quic"] == 1
            and st["fetched_unix"] == 0,
            (got, st),
        )
        got = ray.get(near.consume.remote(a.produce.remote(100)), timeout=WAIT)
        st = ray.get(near.stats.remote())
        check(
            "two nodes: force_remote sends a same-node consumer over QUIC too",
            got == float(sum(range(100))) and st["fetched_quic"] == 1 and st["fetched_unix"] == 0,
            (got, st),
        )
        where = ray.get(a.where.remote())
        check(
            "two nodes: the QUIC address pins the producer's certificate",
            "#sha256=" in (where.get("quic") or ""),
            where,
        )
        try:
            ferry._native.connect(where["quic"], token="not-the-token")
            check("two nodes: a peer without the configured token is refused", False, "connected")
        except Exception as e:
            check(
                "two nodes: a peer without the configured token is refused",
                "token" in str(e).lower(),
                repr(e),
            )
        # The producer dies: a consumer on another node gets ProducerGone (QUIC's handshake
        # or idle timeout, 10 s), not Ray's 60 s fetch timeout.
        print("step: a producer to kill", flush=True)
        d = Producer.options(resources={"n1": 1}).remote()
        ref = d.produce.remote(32)
        ray.wait([ref], timeout=WAIT)
        kill_producer(d)
        try:
            ray.get(far.consume.remote(ref), timeout=WAIT)
        except Exception as e:
            check(
                "two nodes: a consumer whose producer died gets ProducerGone",
                isinstance(e, ferry.ray.ProducerGone),
                repr(e)[:500],
            )
        else:
            check("two nodes: a consumer whose producer died gets ProducerGone", False, "no error")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    {"one-node": one_node, "two-nodes": two_nodes}[MODE]()
