"""Weight sync benchmark (issue 47 point 6; `cargo xtask bench-weights`, one run).

A bf16 state_dict (`--mib`, default 1024: 256 tensors of 4 MiB), a training step that
changes 1% of the elements at random, `--subs` subscribers (default 4), each in a network
namespace the benchmark makes, behind one bridge; the publisher's store in its own
namespace whose link (veth egress) `tc` limits to each `--rates` (default 10gbit, 1gbit).

Rows per rate: the full transfer (today's `open_weights` over QUIC, every subscriber at
once), a subscriber's first sync (`update` from nothing: every tensor whole, verified),
ferry's delta (publish -> all subscribers applied to a model: `wait_for` + `apply_to`), and
torch.distributed broadcast (gloo), with where the delta's time went (publish, the store's
digests and comparison, the wire, the subscribers' checks and writes). Then same-host
figures: publish of the new version into a store this process hosts against a copy of the
changed tensors' bytes and of the changed elements, the pages the step touched, and a
safetensors file re-read. Needs root (`ip netns`, `tc`); without it, says so and measures
over loopback.

All processes share this machine's cores: on N hosts each subscriber would have its own.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

TENSOR_MIB = 4
FRAC = 0.01


def state(mib: int, seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    n = max(1, mib // TENSOR_MIB)
    per = (mib << 20) // n // 2
    return {f"layer{i}.w": torch.randn(per, generator=g).to(torch.bfloat16) for i in range(n)}


def train_step(sd: dict[str, Any], frac: float, seed: int) -> list[Any]:
    """Changes `frac` of each tensor's elements at random, in place; returns the indices
    drawn per tensor (a few repeat)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    drawn = []
    for t in sd.values():
        k = max(1, int(t.numel() * frac))
        idx = torch.randint(0, t.numel(), (k,), generator=g)
        t[idx] = t[idx] + 0.01
        drawn.append(idx)
    return drawn


def out(**kv: Any) -> None:
    print(json.dumps(kv), flush=True)


# ---- roles (run inside the namespaces) ----


def role_store(a: argparse.Namespace) -> None:
    """The store and an in-process publisher; commands on stdin: `pub V`, `step`, `quit`."""
    import ferry
    import ferry.weights as fw

    s = ferry.StoreServer(a.listen, token="bench", delta_bases=1)
    out(addr=s.addr)
    pub = fw.Publisher(s, "model")
    sd = state(a.mib, 1)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "pub":
            t0 = time.time()
            pub.publish(sd, version=int(cmd[1]))
            out(t0=t0, t1=time.time())
        elif cmd[0] == "step":
            t0 = time.time()
            train_step(sd, FRAC, 2)
            out(s=time.time() - t0)
        elif cmd[0] == "quit":
            break
    s.stop()


def engine(sd: dict[str, Any]) -> Any:
    """An engine's model: a module whose buffers have `sd`'s names, shapes and dtypes."""
    import torch

    m = torch.nn.Module()
    for n, t in sd.items():
        layer, w = n.split(".")
        if not hasattr(m, layer):
            m.add_module(layer, torch.nn.Module())
        getattr(m, layer).register_buffer(w, torch.zeros_like(t))
    return m


def role_sub(a: argparse.Namespace) -> None:
    """A subscriber with a model; commands: `open`, `sync`, `wait V`, `timings`, `quit`."""

    import ferry
    import ferry.weights as fw

    sub = fw.subscribe(a.addr, "model", token="bench", connect_timeout=30)
    model: Any = None
    out(ready=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "open":  # today's path: the whole version over QUIC
            b = ferry.open_weights(a.addr, "model", token="bench", timeout=900)
            out(t=time.time(), bytes=int(b.nbytes))
            b.close()
            del b
            gc.collect()
        elif cmd[0] == "sync":  # the first update: every tensor whole, verified
            r = sub.update(timeout=900)
            done = time.time()
            if model is None:
                model = engine(sub.state_dict())
            sub.apply_to(model)
            out(t=done, applied=time.time(), **r)
        elif cmd[0] == "wait":
            sub.wait_for(int(cmd[1]), timeout=900)
            got = time.time()
            sub.apply_to(model)
            out(t=got, applied=time.time(), **(sub.last_update or {}))
        elif cmd[0] == "timings":
            out(timings=sub._n.store_timings(timeout=30))
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
        out(dt=time.time() - t0)
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
        pre = ("ip", "netns", "exec", "fwb-pub", "tc", "qdisc")
        sh(*pre, "del", "dev", "eth0", "root", check=False)
        sh(
            *pre,
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


def send(p: subprocess.Popen[str], cmd: str) -> None:
    assert p.stdin is not None
    p.stdin.write(cmd + "\n")
    p.stdin.flush()


def ask(p: subprocess.Popen[str], cmd: str | None = None) -> dict[str, Any]:
    assert p.stdout is not None
    if cmd is not None:
        send(p, cmd)
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"a benchmark process ended (rc {p.poll()})")
    return dict(json.loads(line))


def all_of(ps: list[subprocess.Popen[str]], cmd: str) -> tuple[float, list[dict[str, Any]]]:
    t0 = time.time()
    for p in ps:
        send(p, cmd)
    return t0, [ask(p) for p in ps]


def gloo(net: Net | None, subs: int, mib: int) -> float:
    world = subs + 1
    master = "10.47.0.1:29547" if net else "127.0.0.1:29547"
    ps = []
    for r in range(world):
        ns = net.names[r] if net else None
        args = ["--role", "gloo", "--rank", str(r), "--world", str(world), "--master", master]
        args += ["--mib", str(mib), "--ifname", "eth0" if net else "lo"]
        ps.append(spawn(ns, *args))
    got = ask(ps[0])
    for p in ps:
        p.wait(900)
    return float(got["dt"])


def run_rate(net: Net | None, rate: str, a: argparse.Namespace) -> dict[str, Any]:
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
    r: dict[str, Any] = {"rate": rate}
    try:
        for s in subs:
            ask(s)
        r["publish1"] = ask(store, "pub 1")
        t0, opened = all_of(subs, "open")
        r["full"] = {"s": max(o["t"] for o in opened) - t0, "bytes": opened[0]["bytes"]}
        t0, synced = all_of(subs, "sync")
        r["sync"] = {"s": max(o["t"] for o in synced) - t0, "bytes": synced[0]["sent_bytes"]}
        # Steady state (a trainer in a loop): `--warmup` steps published and followed first.
        v = 1
        for _ in range(a.warmup):
            v += 1
            ask(store, "step")
            for s in subs:
                send(s, f"wait {v}")
            ask(store, f"pub {v}")
            for s in subs:
                ask(s)
        v += 1
        r["step_s"] = ask(store, "step")["s"]
        # Every subscriber waits (a long poll in flight) before the publish.
        for s in subs:
            send(s, f"wait {v}")
        time.sleep(2.0)
        pub = ask(store, f"pub {v}")
        done = [ask(s) for s in subs]
        timings = ask(subs[0], "timings")["timings"]
        last = [t for t in timings if t["to"] == done[0]["version"] and t["from"] is not None]
        r["delta"] = {"pub": pub, "subs": done, "store": last[-1] if last else None}
        # One more step followed by one subscriber alone: what each would take on a host of
        # its own (here the four share the cores checking their copies).
        v += 1
        ask(store, "step")
        send(subs[0], f"wait {v}")
        time.sleep(2.0)
        pub = ask(store, f"pub {v}")
        r["solo"] = {"pub": pub, "sub": ask(subs[0])}
    finally:
        for p in [*subs, store]:
            with contextlib.suppress(BrokenPipeError, OSError):
                send(p, "quit")
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    r["gloo_s"] = gloo(net, a.subs, a.mib) if not a.no_gloo else None
    return r


def same_host(a: argparse.Namespace) -> dict[str, Any]:
    """Publish into a store this process hosts vs copies of the changed bytes (same run)."""
    import torch
    from safetensors.torch import load_file, save_file

    import ferry
    import ferry.weights as fw

    sd = state(a.mib, 1)
    full = sum(t.numel() * t.element_size() for t in sd.values())
    r: dict[str, Any] = {"full": full}
    with ferry.StoreServer(f"unix:fwb-{os.getpid()}", delta_bases=1) as s:
        pub = fw.Publisher(s, "m")
        sub = fw.subscribe(s.addr, "m")
        pub.publish(sd, version=1)
        sub.wait_for(1, timeout=900)
        train_step(sd, FRAC, 2)
        gc.collect()
        t0 = time.perf_counter()
        pub.publish(sd, version=2)  # the first step: into memory never touched
        r["publish_cold"] = time.perf_counter() - t0
        sub.wait_for(2, timeout=900)
        before = {n: t.clone() for n, t in sd.items()}
        drawn = train_step(sd, FRAC, 3)
        gc.collect()
        time.sleep(2.0)  # (a training step's time: the store's spare buckets get ready)
        t0 = time.perf_counter()
        pub.publish(sd, version=3)
        r["publish"] = time.perf_counter() - t0
        u = sub.update(timeout=900)
        r["delta_sent"], r["delta_full"] = u["sent_bytes"], u["full_bytes"]
        t0 = time.perf_counter()
        first = next(iter(sd))
        pub.publish({first: sd[first]}, version=4, changed=[first])
        r["publish_one_changed"] = time.perf_counter() - t0
        r["one_changed_bytes"] = sd[first].numel() * 2
    # What the step changed: tensors, elements, pages.
    changed_tensors, changed_elems, pages, touched = 0, 0, 0, 0
    idx_all = []
    for (n, t), idx in zip(sd.items(), drawn, strict=True):
        d = (t.view(torch.int16) != before[n].view(torch.int16)).nonzero().view(-1)
        changed_tensors += int(d.numel() > 0)
        changed_elems += int(d.numel())
        per_page = 4096 // t.element_size()
        pages += (t.numel() + per_page - 1) // per_page
        touched += int(torch.unique(d // per_page).numel())
        idx_all.append((n, d, idx))
    r.update(
        changed_tensors=changed_tensors,
        changed_tensor_bytes=sum(sd[n].numel() * 2 for n, d, _ in idx_all if d.numel()),
        changed_elems=changed_elems,
        changed_elem_bytes=changed_elems * 2,
        pages=pages,
        touched_pages=touched,
        per_page=4096 // 2,
    )
    del before
    # Copies of the changed tensors' bytes: into new memory (as a version written where
    # nothing was before) and into memory already mapped (as into a spare bucket); best of 3.
    srcs = [sd[n].view(-1).view(torch.uint8).numpy() for n, d, _ in idx_all if d.numel()]
    total = sum(x.size for x in srcs)
    new_s, mapped_s = [], []
    for _ in range(3):
        m = mmap.mmap(-1, max(1, total))
        dst = np.frombuffer(m, dtype=np.uint8)
        for times in (new_s, mapped_s):
            t0 = time.perf_counter()
            o = 0
            for x in srcs:
                dst[o : o + x.size] = x
                o += x.size
            times.append(time.perf_counter() - t0)
        del dst
        m.close()
    r["copy_new"], r["copy_mapped"] = min(new_s), min(mapped_s)
    # The changed elements alone, scattered into a copy of the tensor (memory mapped).
    dsts = [before_t.clone() for before_t in (sd[n] for n, _, _ in idx_all)]
    t0 = time.perf_counter()
    for dst, (n, d, _) in zip(dsts, idx_all, strict=True):
        dst.view(-1).index_copy_(0, d, sd[n].view(-1).index_select(0, d))
    r["copy_elems"] = time.perf_counter() - t0
    del dsts
    gc.collect()
    with tempfile.TemporaryDirectory(dir=a.tmp) as d:
        f = os.path.join(d, "m.safetensors")
        t0 = time.perf_counter()
        save_file(sd, f)
        r["st_save"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = load_file(f)
        # Every page read (load_file may map the file lazily).
        _ = sum(int(t.view(-1)[:: 4096 // t.element_size()].float().sum()) for t in got.values())
        r["st_load"] = time.perf_counter() - t0
        del got
    return r


def row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def report(a: argparse.Namespace, rows: list[dict[str, Any]], same: dict[str, Any] | None) -> None:
    full_b = a.mib << 20
    n = max(1, a.mib // TENSOR_MIB)
    print(
        f"\n## bench-weights: {a.mib} MiB bf16, {n} tensors, {FRAC:.0%} of the elements"
        f" changed, {a.subs} subscribers\n"
    )
    row("link", "row", "s", "bytes per subscriber")
    row("---", "---", "---", "---")
    for r in rows:
        d, rate = r["delta"], r["rate"]
        applied = max(s["applied"] for s in d["subs"]) - d["pub"]["t0"]
        sent = d["subs"][0]["sent_bytes"]
        row(
            rate,
            "full transfer (`open_weights`, QUIC)",
            f"{r['full']['s']:.2f}",
            f"{r['full']['bytes']:,}",
        )
        row(
            rate,
            "first sync (`update` from nothing, verified)",
            f"{r['sync']['s']:.2f}",
            f"{r['sync']['bytes']:,}",
        )
        row(
            rate,
            "ferry delta, publish -> all applied (`wait_for` + `apply_to`)",
            f"{applied:.2f}",
            f"{sent:,} ({sent / full_b:.2%})",
        )
        if r.get("gloo_s") is not None:
            row(rate, "torch.distributed broadcast (gloo)", f"{r['gloo_s']:.2f}", f"{full_b:,}")
    if same:
        row(
            "same host",
            "safetensors file re-read (page cache warm)",
            f"{same['st_load']:.2f}",
            f"{full_b:,}",
        )
    print("\n### Where the delta's time went (seconds after `publish` was called)\n")
    row(
        "link",
        "publish returned",
        "store: delta started",
        "store: digests",
        "store: diff",
        "first answer in",
        "last answer in",
        "last copy checked+written",
        "last model applied",
    )
    row(*["---"] * 9)
    for r in rows:
        d = r["delta"]
        t0 = d["pub"]["t0"]
        st = d["store"] or {}
        tm = st.get("times", {})
        recv = [s["received_at"] - t0 for s in d["subs"]]
        checked = [s["received_at"] + s["apply_s"] - t0 for s in d["subs"]]
        row(
            r["rate"],
            f"{d['pub']['t1'] - t0:.3f}",
            f"{st['started_ms'] / 1e3 - t0:.3f}" if st else "?",
            f"{tm.get('digests_ms', float('nan')) / 1e3:.3f}",
            f"{tm.get('diff_ms', float('nan')) / 1e3:.3f}",
            f"{min(recv):.3f}",
            f"{max(recv):.3f}",
            f"{max(checked):.3f}",
            f"{max(s['applied'] for s in d['subs']) - t0:.3f}",
        )
    print("\n### One subscriber alone (what each takes on a host of its own)\n")
    row(
        "link",
        "publish returned",
        "answer in",
        "copy checked+written",
        "model applied",
        "checked+written (4 at once, above)",
    )
    row(*["---"] * 6)
    for r in rows:
        so = r.get("solo")
        if not so:
            continue
        t0, sub = so["pub"]["t0"], so["sub"]
        four = max(x["apply_s"] for x in r["delta"]["subs"])
        row(
            r["rate"],
            f"{so['pub']['t1'] - t0:.3f}",
            f"{sub['received_at'] - t0:.3f}",
            f"{sub['apply_s']:.3f}",
            f"{sub['applied'] - t0:.3f}",
            f"{four:.3f}",
        )
    print("\n### Against the targets\n")
    row("target", "measured", "verdict")
    row("---", "---", "---")
    for r in rows:
        d, rate = r["delta"], r["rate"]
        sent = d["subs"][0]["sent_bytes"]
        ratio = (max(s["applied"] for s in d["subs"]) - d["pub"]["t0"]) / r["full"]["s"]
        row(
            f"{rate}: delta bytes <= 3% of full",
            f"{sent / full_b:.2%}",
            verdict(sent <= 0.03 * full_b),
        )
        note = "" if rate == "1gbit" else " (the target is at 1 Gbit/s)"
        row(
            f"{rate}: publish -> all applied <= 0.1x full transfer",
            f"{ratio:.3f}x",
            verdict(ratio <= 0.1) + note,
        )
    if not same:
        return
    s = same
    row(
        "same host: publish <= 2x a copy of the changed tensors' bytes into new memory",
        f"{s['publish'] / s['copy_new']:.2f}x ({s['publish']:.3f} s / {s['copy_new']:.3f} s)",
        verdict(s["publish"] <= 2 * s["copy_new"]),
    )
    row(
        "same host: against a copy into memory already mapped",
        f"{s['publish'] / s['copy_mapped']:.2f}x ({s['copy_mapped']:.3f} s)",
        verdict(s["publish"] <= 2 * s["copy_mapped"]),
    )
    row(
        "same host: against a copy of the changed elements only",
        f"{s['publish'] / s['copy_elems']:.1f}x ({s['copy_elems']:.3f} s)",
        "see the pages",
    )
    print("\n### Same host\n")
    print(
        f"- changed: {s['changed_tensors']} of {n} tensors ({s['changed_tensor_bytes']:,} B),"
        f" {s['changed_elems']:,} elements ({s['changed_elem_bytes']:,} B,"
        f" {s['changed_elem_bytes'] / s['full']:.2%} of the bytes)"
    )
    q = (1 - FRAC) ** s["per_page"]
    print(
        f"- 4 KiB pages touched: {s['touched_pages']:,} of {s['pages']:,}. A page holds"
        f" {s['per_page']} bf16 elements: one escapes a {FRAC:.0%} random step with"
        f" probability (1 - {FRAC})^{s['per_page']} = {q:.1e} (expected untouched pages:"
        f" {q * s['pages']:.1e}), so a new version that readers map zero-copy (sharing at"
        " page granularity at best) writes every page: a copy of the changed tensors' bytes"
    )
    print(
        f"- publish of the step: {s['publish']:.3f} s (the first step, into memory never"
        f" touched: {s['publish_cold']:.3f} s); of one changed tensor (`changed=`):"
        f" {s['publish_one_changed'] * 1e3:.1f} ms for {s['one_changed_bytes']:,} B"
    )
    print(
        f"- delta bytes, same host: {s['delta_sent']:,} of {s['delta_full']:,}"
        f" ({s['delta_sent'] / s['delta_full']:.2%})"
    )
    print(f"- safetensors: save {s['st_save']:.2f} s, re-read {s['st_load']:.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--role", default="driver")
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--subs", type=int, default=4)
    p.add_argument("--rates", default="10gbit,1gbit")
    p.add_argument("--no-gloo", action="store_true")
    p.add_argument("--warmup", type=int, default=1, help="steps published before the measured one")
    p.add_argument("--no-same-host", action="store_true")
    p.add_argument("--tmp", default=None, help="directory for the safetensors file")
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
        f"bench-weights: {os.cpu_count()} cores shared by the store and {a.subs} subscribers",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    try:
        for rate in a.rates.split(",") if net else ["loopback"]:
            rows.append(run_rate(net, rate, a))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if net:
            net.cleanup()
    same = None if a.no_same_host else same_host(a)
    if same:
        print(json.dumps(same), flush=True)
    report(a, rows, same)


if __name__ == "__main__":
    main()
