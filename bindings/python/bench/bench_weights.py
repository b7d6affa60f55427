"""Weight sync benchmark (issue 47 point 6; `cargo xtask bench-weights`, one run).

A bf16 state_dict (`--mib`, default 1024: 256 tensors of 4 MiB), a training step that
changes 1% of the elements at random, `--subs` subscribers (default 4), each in a network
namespace the benchmark makes, behind one bridge; the publisher's store in its own
namespace whose link (veth egress) `tc` limits to each `--rates` (default 10gbit, 1gbit).
Rows per rate: the full transfer (a fresh subscriber: every tensor whole over QUIC),
ferry's delta (publish -> all subscribers applied), torch.distributed broadcast (gloo),
a safetensors file re-read (same host). Then same-host figures: publish of the new
version vs a copy of the changed bytes. Needs root (`ip netns`, `tc`); without it, says
so and measures over loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

TENSOR_MIB = 4


def state(mib: int, seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    n = max(1, mib // TENSOR_MIB)
    per = (mib << 20) // n // 2
    return {f"layer{i}.w": torch.randn(per, generator=g).to(torch.bfloat16) for i in range(n)}


def train_step(sd: dict[str, Any], frac: float, seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, t in sd.items():
        b = t.clone()
        k = max(1, int(b.numel() * frac))
        idx = torch.randint(0, b.numel(), (k,), generator=g)
        b[idx] = b[idx] + 0.01
        out[n] = b
    return out


# ---- roles (run inside the namespaces) ----


def role_store(a: argparse.Namespace) -> None:
    """The store and the publisher; commands on stdin: `pub V`, `quit`."""
    import ferry
    import ferry.weights as fw

    s = ferry.StoreServer(a.listen, token="bench")
    print(json.dumps({"addr": s.addr}), flush=True)
    pub = fw.Publisher(s, "model", token="bench")
    v1 = state(a.mib, 1)
    v2 = train_step(v1, 0.01, 2)
    versions = {1: v1, 2: v2}
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "pub":
            v = int(cmd[1])
            t0 = time.time()
            pub.publish(versions[1 + (v + 1) % 2], version=v)
            print(json.dumps({"t0": t0, "t1": time.time()}), flush=True)
        elif cmd[0] == "quit":
            break
    s.stop()


def role_sub(a: argparse.Namespace) -> None:
    """A subscriber; commands on stdin: `full`, `wait V`, `quit`."""
    import ferry.weights as fw

    sub = fw.subscribe(a.addr, "model", token="bench", connect_timeout=30)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "full":
            fresh = fw.subscribe(a.addr, "model", token="bench")
            t0 = time.time()
            r = fresh.update(timeout=600)
            print(json.dumps({"t": time.time(), "dt": time.time() - t0, **r}), flush=True)
        elif cmd[0] == "wait":
            sub.wait_for(int(cmd[1]), timeout=600)
            print(json.dumps({"t": time.time(), **(sub.last_update or {})}), flush=True)
        elif cmd[0] == "quit":
            break


def role_gloo(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", a.ifname)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{a.master}", rank=a.rank, world_size=a.world
    )
    n = max(1, a.mib // TENSOR_MIB)
    per = (a.mib << 20) // n // 2
    ts = [torch.zeros(per, dtype=torch.bfloat16) for _ in range(n)]
    dist.barrier()
    t0 = time.time()
    for t in ts:
        dist.broadcast(t, src=0)
    dist.barrier()
    if a.rank == 0:
        print(json.dumps({"dt": time.time() - t0}), flush=True)
    dist.destroy_process_group()


# ---- the driver (root namespace) ----


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class Net:
    """A bridge, the publisher's namespace (its link limited by tc) and one per subscriber."""

    def __init__(self, subs: int) -> None:
        self.names = ["fwb-pub"] + [f"fwb-s{i}" for i in range(subs)]
        self.cleanup()
        sh("ip", "link", "add", "fwb-br", "type", "bridge")
        sh("ip", "link", "set", "fwb-br", "up")
        for k, ns in enumerate(self.names):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", f"{ns}-h", "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", f"{ns}-h", "master", "fwb-br", "up")
            sh("ip", "-n", ns, "addr", "add", f"10.47.0.{k + 1}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def limit(self, rate: str) -> None:
        sh(
            "ip",
            "netns",
            "exec",
            "fwb-pub",
            "tc",
            "qdisc",
            "del",
            "dev",
            "eth0",
            "root",
            check=False,
        )
        sh(
            "ip",
            "netns",
            "exec",
            "fwb-pub",
            "tc",
            "qdisc",
            "add",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            "8mb",
            "latency",
            "200ms",
        )

    def cleanup(self) -> None:
        for ns in getattr(self, "names", []) or [
            f"fwb-{x}" for x in ["pub", *[f"s{i}" for i in range(16)]]
        ]:
            sh("ip", "link", "del", f"{ns}-h", check=False)
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", "fwb-br", check=False)


def spawn(ns: str | None, *args: str) -> subprocess.Popen[str]:
    pre = ["ip", "netns", "exec", ns] if ns else []
    return subprocess.Popen(
        [*pre, sys.executable, __file__, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def ask(p: subprocess.Popen[str], cmd: str | None = None) -> dict[str, Any]:
    assert p.stdin is not None and p.stdout is not None
    if cmd is not None:
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"a benchmark process ended (rc {p.poll()})")
    return dict(json.loads(line))


def gloo(net: Net | None, subs: int, mib: int) -> float:
    world = subs + 1
    master = "10.47.0.1:29547" if net else "127.0.0.1:29547"
    ps = []
    for r in range(world):
        ns = net.names[r] if net else None
        ps.append(
            spawn(
                ns,
                "--role",
                "gloo",
                "--rank",
                str(r),
                "--world",
                str(world),
                "--master",
                master,
                "--mib",
                str(mib),
                "--ifname",
                "eth0" if net else "lo",
            )
        )
    out = ask(ps[0])
    for p in ps:
        p.wait(600)
    return float(out["dt"])


def run_rate(net: Net | None, rate: str, a: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    if net:
        net.limit(rate)
    listen = "quic://10.47.0.1:0" if net else "quic://127.0.0.1:0"
    store = spawn(
        net.names[0] if net else None, "--role", "store", "--listen", listen, "--mib", str(a.mib)
    )
    addr = ask(store)["addr"]
    subs = [
        spawn(net.names[1 + i] if net else None, "--role", "sub", "--addr", addr)
        for i in range(a.subs)
    ]
    try:
        for s in subs:
            ask(s)
        ask(store, "pub 1")
        # Full transfer: each subscriber, at once, a fresh copy of version 1 (every tensor whole).
        t0 = time.time()
        for s in subs:
            s.stdin.write("full\n")  # type: ignore[union-attr]
            s.stdin.flush()  # type: ignore[union-attr]
        full = [ask(s) for s in subs]
        full_dt = max(f["t"] for f in full) - t0
        rows.append(
            {
                "rate": rate,
                "row": "full transfer (QUIC, every tensor)",
                "s": full_dt,
                "bytes/sub": full[0]["sent_bytes"],
            }
        )
        for s in subs:
            ask(s, "wait 1")
        # Delta: publish version 2 (1% of the elements changed), subscribers already waiting.
        for s in subs:
            s.stdin.write("wait 2\n")  # type: ignore[union-attr]
            s.stdin.flush()  # type: ignore[union-attr]
        pub = ask(store, "pub 2")
        done = [ask(s) for s in subs]
        delta_dt = max(d["t"] for d in done) - pub["t0"]
        rows.append(
            {
                "rate": rate,
                "row": "ferry delta (publish -> all applied)",
                "s": delta_dt,
                "bytes/sub": done[0].get("sent_bytes"),
                "publish_s": pub["t1"] - pub["t0"],
            }
        )
    finally:
        for p in [*subs, store]:
            try:
                p.stdin.write("quit\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                pass
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    rows.append(
        {
            "rate": rate,
            "row": "torch.distributed broadcast (gloo)",
            "s": gloo(net, a.subs, a.mib),
            "bytes/sub": a.mib << 20,
        }
    )


def same_host(a: argparse.Namespace) -> list[dict[str, Any]]:
    from safetensors.torch import load_file, save_file

    import ferry
    import ferry.weights as fw

    v1 = state(a.mib, 1)
    v2 = train_step(v1, 0.01, 2)
    out = []
    with ferry.StoreServer(f"unix:fwb-{os.getpid()}") as s:
        pub = fw.Publisher(s, "m")
        sub = fw.subscribe(s.addr, "m")
        pub.publish(v1, version=1)
        sub.wait_for(1, timeout=600)
        t0 = time.perf_counter()
        pub.publish(v2, version=2)
        out.append(
            {"what": "same-host publish of version 2 (compare)", "s": time.perf_counter() - t0}
        )
        r = sub.update(timeout=600)
        t0 = time.perf_counter()
        pub.publish(v1, version=3, changed=list(v1))
        out.append({"what": "same-host publish, changed=all named", "s": time.perf_counter() - t0})
        out.append(
            {
                "what": "delta bytes / full bytes",
                "s": None,
                "ratio": r["sent_bytes"] / r["full_bytes"],
                "sent": r["sent_bytes"],
                "full": r["full_bytes"],
            }
        )
    # Copy of the changed bytes: the changed elements (1%) gathered and scattered once.
    changed = 0
    t0 = time.perf_counter()
    for n in v1:
        d = (v1[n] != v2[n]).nonzero().view(-1)
        changed += int(d.numel()) * 2
    t_find = time.perf_counter() - t0
    buf = np.empty(changed, dtype=np.uint8)
    src = np.random.default_rng(0).integers(0, 255, changed, dtype=np.uint8)
    t0 = time.perf_counter()
    buf[:] = src
    t_copy = time.perf_counter() - t0
    whole = np.empty(a.mib << 20, dtype=np.uint8)
    t0 = time.perf_counter()
    whole[:] = 1
    t_whole = time.perf_counter() - t0
    out.append({"what": f"memcpy of the changed bytes ({changed} B)", "s": t_copy})
    out.append({"what": "finding the changed elements (torch compare)", "s": t_find})
    out.append({"what": f"memset of the whole state ({a.mib} MiB)", "s": t_whole})
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "m.safetensors")
        t0 = time.perf_counter()
        save_file(v2, f)
        t_save = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = load_file(f)
        _ = sum(int(t.view(-1)[0].item() != 0) for t in got.values())
        out.append({"what": "safetensors save (trainer side)", "s": t_save})
        out.append(
            {
                "what": "safetensors file re-read (engine side, page cache warm)",
                "s": time.perf_counter() - t0,
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--role", default="driver")
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--subs", type=int, default=4)
    p.add_argument("--rates", default="10gbit,1gbit")
    p.add_argument("--listen", default="")
    p.add_argument("--addr", default="")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--master", default="")
    p.add_argument("--ifname", default="lo")
    a = p.parse_args()
    if a.role != "driver":
        {"store": role_store, "sub": role_sub, "gloo": role_gloo}[a.role](a)
        return
    net: Net | None = None
    why = ""
    if os.geteuid() != 0:
        why = "not root"
    else:
        try:
            net = Net(a.subs)
        except subprocess.CalledProcessError as e:
            why = f"{' '.join(e.cmd)}: {e.stderr.strip()}"
    if net is None:
        print(f"bench-weights: no network namespaces ({why}): loopback, no tc limit", flush=True)
    print(
        f"bench-weights: {a.mib} MiB bf16 in {max(1, a.mib // TENSOR_MIB)} tensors, "
        f"1% of the elements changed per step, {a.subs} subscribers",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    try:
        for rate in a.rates.split(",") if net else ["loopback"]:
            run_rate(net, rate, a, rows)
    finally:
        if net:
            net.cleanup()
    print(f"\n{'link':>9} | {'row':<40} | {'seconds':>8} | bytes per subscriber")
    for r in rows:
        print(f"{r['rate']:>9} | {r['row']:<40} | {r['s']:8.3f} | {r.get('bytes/sub') or ''}")
    by = {(r["rate"], r["row"][:4]): r["s"] for r in rows}
    for rate in {r["rate"] for r in rows}:
        f, d = by.get((rate, "full")), by.get((rate, "ferr"))
        if f and d:
            print(f"{rate}: publish -> all applied / full transfer = {d / f:.3f} (target <= 0.1)")
    print()
    for r in same_host(a):
        extra = (
            f" ratio {r['ratio']:.4f} ({r['sent']} of {r['full']} B; target <= 0.03)"
            if "ratio" in r
            else ""
        )
        s = "" if r["s"] is None else f"{r['s']:.4f} s"
        print(f"{r['what']:<58} {s}{extra}")


if __name__ == "__main__":
    main()
