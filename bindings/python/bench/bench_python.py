"""ferry's Python face against what Python users pick today, in one run
(`cargo xtask bench-python [--load N]`, or run it with `FERRY_BIN` set to a release
`ferry` and the package installed, iceoryx2 and torch optional).

Round trips between two Python processes (the parent sends, a child sends the same data
back), zero-copy where each contender allows, p50 and p99 in microseconds:

- `rtt-64B` and `rtt-24.9MB` (f32[1920,1080,3]):
  - `ferry.Pipe`: `ferry.listen` / `ferry.connect`; the big array from `Pipe.alloc`, the
    peer sends the received (read-only) array back as it is: no copy either way;
  - `shm+mp.Pipe`: `multiprocessing.shared_memory` holds the array, its name, shape and
    dtype go over a `multiprocessing.Pipe`; the peer maps the segment once and answers
    with the same descriptor (what a Python user writes in 20 lines);
  - `iceoryx2 poll` / `iceoryx2 event`: iceoryx2's Python request-response with a
    `Slice[c_uint8]` payload; the server busy-polls (`poll`) or waits on an event service
    (`event`); a received sample cannot be sent back, so each side copies the bytes into
    a loaned sample (a polling peer is parked between its turns so it does not spin while
    the other contenders run);
  - `torch.mp.Queue`: `torch.multiprocessing` queues carrying a torch tensor (its storage
    in shared memory, a file descriptor passed per message).
- `add`: `add(1, 2)` from one `ferry.Client` to `ferry.App` (`python -m ferry serve`) and
  to the Rust-served demo API (`ferry serve`); the Python-served `add` through
  `client.functions.add(1, 2)`; and the same function served with the standard library
  (`stdlib mp.connection`: a `multiprocessing.connection` listener on a unix socket that
  answers pickled `("add", (1, 2))` requests, what a Python user writes in 15 lines to
  call a function in another process).
- `echo-24.9MB`: `echo` of an f32[1920,1080,3] from `client.alloc` (shm, zero-copy both
  ways), Python-served and Rust-served.

Contenders of one row run interleaved in rounds (a noisy neighbour hits all alike), and
`ferry.Pipe` and the stdlib pair start a fresh peer process for every turn: where the
scheduler places two processes (on one CPU or two) decides a round trip's cost more than
anything they do, and differs from one pair to the next, so a ratio of rows measured with
one pair each would compare two placements. Each turn's first round trips are untimed
(a tenth of the turn's, at least `WARMUP`, so that every row leaves out the same start-up):
a fresh pair's first few are its start-up (mapping the memory, the wait policy learning
the machine), which the table does not mix into the steady state's p99; the `start-up`
lines after the table give them apart, for the contenders that start a peer per turn.
`--load N` starts N CPU burners at nice 0 (`ferry __burn`) beside the benchmark. Ratios and
the issue's targets' verdicts are printed after the table.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

import ferry

HERE = Path(__file__).resolve().parent
SHAPE = (1920, 1080, 3)
BIG = int(np.prod(SHAPE)) * 4
PARK, STOP = 0xFE, 0xFF

Case = Callable[[], None]


WARMUP = 30
"""The fewest untimed round trips that start each turn (module docs). The same for every
row by default (the 64 B row's tenth of 300): with 10, the 24.9 MB row (30 timed round
trips a turn) measured a fresh pipe's round trips 10-40, still about 1 us slower than
its 40th-200th (the wait policy still learning), against the 64 B row's 30-330.

For the same reason the 24.9 MB rows time as many round trips as the 64 B rows by
default (`--big-iters` 3000, 500 a turn with 6 rounds): with 300 (50 a turn, round trips
30-80 of a fresh pipe), ferry.Pipe's 24.9 MB row was 1.62x its 64 B row in one run, and
1.17-1.35x in three runs timing both rows over round trips 50-550."""


class Row:
    """Samples of one contender of one case."""

    def __init__(self, case: str, who: str) -> None:
        self.case, self.who = case, who
        self.samples: list[float] = []
        self.startup: list[list[float]] = []
        """Each timed turn's untimed first round trips, in order."""
        self.note = ""

    def p(self, q: float) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, int(len(s) * q))] * 1e6 if s else float("nan")


class Contender:
    """A way to do one round trip: `run` does it; `begin` / `end` bracket a turn (a polling
    peer is woken and parked there)."""

    def __init__(self, run: Case, begin: Case | None = None, end: Case | None = None) -> None:
        self.run, self.begin, self.end = run, begin, end


def interleave(case: str, cs: dict[str, Contender], n: int, rounds: int) -> list[Row]:
    rows = {k: Row(case, k) for k in cs}
    per = max(1, n // rounds)
    for r in range(rounds + 1):  # round 0: warm-up, not timed
        for k, c in cs.items():
            if c.begin:
                c.begin()
            # Every turn starts with a tenth of its round trips untimed, at least WARMUP: a
            # fresh peer maps the memory and warms up in them (module docs).
            first = []
            for _ in range(max(WARMUP, per // 10)):
                t = time.perf_counter()
                c.run()
                first.append(time.perf_counter() - t)
            if r:
                rows[k].startup.append(first)
            for _ in range(per if r else 0):
                t = time.perf_counter()
                c.run()
                rows[k].samples.append(time.perf_counter() - t)
            if c.end:
                c.end()
    return list(rows.values())


# ---- peers (child processes) -------------------------------------------------------------


def ferry_peer(addr: str) -> None:
    pipe = ferry.connect(addr)
    print("ready", flush=True)
    while True:
        header, ts = pipe.recv()
        pipe.send(header, ts)  # received tensors are read-only views: sent back, no copy
        if header.get("bye"):
            return


def stdlib_peer(conn: Any) -> None:
    # (A spawned child shares the parent's resource tracker: the segments stay the
    # parent's to unlink, so the child neither unregisters nor unlinks them.)
    seen: dict[str, shared_memory.SharedMemory] = {}
    while True:
        msg = conn.recv()
        if msg is None:
            break
        name, shape, dtype = msg
        if name not in seen:
            seen[name] = shared_memory.SharedMemory(name=name)
        a = np.ndarray(shape, dtype, buffer=seen[name].buf)  # the sender's bytes, mapped
        conn.send((name, a.shape, a.dtype.str))
        del a
    for s in seen.values():
        s.close()


def stdlib_rpc_server(path: str) -> None:
    """The stdlib contender of `add`: one connection, pickled `(name, args)` requests."""
    from multiprocessing.connection import Listener

    functions: dict[str, Callable[..., Any]] = {"add": lambda a, b: a + b}
    with Listener(path, "AF_UNIX") as listener:
        print("listening on", path, flush=True)
        with listener.accept() as conn:
            while True:
                try:
                    name, args = conn.recv()
                except EOFError:
                    return
                conn.send(functions[name](*args))


def torch_peer(q_in: Any, q_out: Any) -> None:
    while True:
        t = q_in.get()
        if t is None:
            return
        q_out.put(t)


def iox_service(tag: str) -> tuple[Any, Any, Any]:
    import iceoryx2 as iox

    iox.set_log_level(iox.LogLevel.Error)  # not its "no config file" warning
    node = iox.NodeBuilder.new().create(iox.ServiceType.Ipc)
    rr = (
        node.service_builder(iox.ServiceName.new(f"ferry-bench/{tag}/rr"))
        .request_response(iox.Slice[ctypes.c_uint8], iox.Slice[ctypes.c_uint8])
        .open_or_create()
    )
    return iox, node, rr


def iox_events(iox: Any, node: Any, tag: str, side: str) -> tuple[Any, Any]:
    """(notifier, listener): requests notify `req`, responses `res`."""

    def ev(name: str) -> Any:
        return (
            node.service_builder(iox.ServiceName.new(f"ferry-bench/{tag}/{name}"))
            .event()
            .open_or_create()
        )

    mine, theirs = ("req", "res") if side == "client" else ("res", "req")
    return ev(mine).notifier_builder().create(), ev(theirs).listener_builder().create()


def iox_peer(tag: str, mode: str) -> None:
    iox, node, rr = iox_service(tag)
    server = (
        rr.server_builder()
        .initial_max_slice_len(64)
        .allocation_strategy(iox.AllocationStrategy.PowerOfTwo)
        .create()
    )
    notifier, listener = iox_events(iox, node, tag, "server") if mode == "event" else (None, None)
    print("ready", flush=True)
    while True:
        req = server.receive()
        if req is None:
            if listener is not None:
                listener.blocking_wait()
            continue
        data = req.payload()
        n = data.len()
        first = data[0] if n else 0
        res = req.loan_slice_uninit(n)
        ctypes.memmove(res.payload().as_ptr(), data.as_ptr(), n)  # the echo copies
        res.assume_init().send()
        if notifier is not None:
            notifier.notify()
        del req
        if n == 1 and first == STOP:
            return
        if n == 1 and first == PARK:
            sys.stdin.readline()  # parked until the parent's next turn


class IoxClient:
    def __init__(self, tag: str, mode: str) -> None:
        iox, node, rr = iox_service(tag)
        self.iox = iox
        self.client = (
            rr.client_builder()
            .initial_max_slice_len(64)
            .allocation_strategy(iox.AllocationStrategy.PowerOfTwo)
            .create()
        )
        events: tuple[Any, Any] = (
            iox_events(iox, node, tag, "client") if mode == "event" else (None, None)
        )
        self.notifier, self.listener = events
        self.keep = (node, rr)

    def rtt(self, src: int, n: int) -> None:
        req = self.client.loan_slice_uninit(n)
        ctypes.memmove(req.payload().as_ptr(), src, n)
        pending = req.assume_init().send()
        if self.notifier is not None:
            self.notifier.notify()
        while True:
            res = pending.receive()
            if res is not None:
                if res.payload().len() != n:
                    raise SystemExit("iceoryx2: the echo came back changed")
                return
            if self.listener is not None:
                self.listener.timed_wait(self.iox.Duration.from_millis(100))


# ---- the run -----------------------------------------------------------------------------


class Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self, cmd: list[str], ready: str, cwd: Path | None = None, stdin: bool = False
    ) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE if stdin else None,
            text=True,
            start_new_session=True,
            cwd=cwd,
        )
        self.procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line.startswith(ready):
            raise SystemExit(f"{cmd}: unexpected first line {line!r}")
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                if p.stdin is not None:
                    p.stdin.close()
                try:
                    p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGTERM)
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()


def me(*args: str) -> list[str]:
    return [sys.executable, __file__, *args]


class FerryPeer:
    """`ferry.Pipe`'s peer, started afresh for every turn of its contender: where the
    scheduler puts a pair of processes (one CPU, or two) decides a round trip's cost more
    than anything either does, and differs from one pair to the next, so one pair for the
    whole run would measure its placement. The stdlib pair gets the same (`StdlibPeer`)."""

    def __init__(self, listener: Any, addr: str, procs: Procs) -> None:
        self.listener, self.addr, self.procs = listener, addr, procs
        self.proc: subprocess.Popen[str] | None = None
        self.pipe: Any = None
        self.big: np.ndarray[Any, Any] | None = None

    def start(self) -> None:
        self.proc = self.procs.start(me("--peer", "ferry", self.addr), "ready")
        self.pipe = self.listener.accept(timeout=30)
        self.big = self.pipe.alloc(SHAPE, "f32")
        self.big[...] = 1.0

    def stop(self) -> None:
        if self.pipe is None:
            return
        pipe, proc = self.pipe, self.proc
        self.pipe, self.big, self.proc = None, None, None
        pipe.send({"bye": True})
        pipe.recv(timeout=30)
        pipe.close()
        if proc is not None:
            proc.wait(timeout=30)


class StdlibPeer:
    """The stdlib pair's peer (`stdlib_peer`), started afresh for every turn."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.conn: Any = None
        self.proc: Any = None

    def start(self) -> None:
        self.conn, theirs = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=stdlib_peer, args=(theirs,), daemon=True)
        self.proc.start()

    def stop(self) -> None:
        if self.conn is None:
            return
        self.conn.send(None)
        self.proc.join(10)
        self.conn, self.proc = None, None


IOX_DIRS = ("/dev/shm", "/tmp/iceoryx2", "/tmp/iceoryx2/nodes", "/tmp/iceoryx2/services")


def iox_files() -> set[str]:
    """iceoryx2's files (its `iox2_` prefix) in /dev/shm and /tmp/iceoryx2."""
    found: set[str] = set()
    for d in IOX_DIRS:
        with contextlib.suppress(OSError):
            found |= {os.path.join(d, n) for n in os.listdir(d) if n.startswith("iox2_")}
    return found


def iox_leftovers_remover() -> Callable[[], None]:
    """iceoryx2 leaves files behind (its global management segment, more when a process
    dies): returns a cleanup that removes those that appeared during the run and says so,
    as `cargo xtask bench-ring` does."""
    before = iox_files()

    def remove() -> None:
        gone = []
        for f in sorted(iox_files() - before):
            try:
                os.remove(f)
                gone.append(f)
            except OSError:
                pass
        print(f"iceoryx2 files left behind, now removed: {gone}", file=sys.stderr)

    return remove


def pipes(a: argparse.Namespace, procs: Procs, tag: str, skipped: list[str]) -> list[Row]:
    import multiprocessing as mp

    small = np.full(64, 7, dtype=np.uint8)
    big = np.ones(SHAPE, np.float32)
    cases: dict[str, dict[str, Contender]] = {"rtt-64B": {}, "rtt-24.9MB": {}}
    cleanup: list[Callable[[], None]] = []

    # ferry.Pipe: a fresh peer process for every turn (`FerryPeer`)
    addr = f"unix:ferry-bench-py-{tag}"
    listener = ferry.listen(addr)
    fpeer = FerryPeer(listener, addr, procs)

    def ferry_rtt(big: bool) -> Case:
        def run() -> None:
            pipe, x = fpeer.pipe, (fpeer.big if big else small)
            assert pipe is not None and x is not None
            pipe.send({"n": 1}, [x])
            _, ts = pipe.recv(timeout=60)
            if ts[0].nbytes != x.nbytes:
                raise SystemExit("ferry.Pipe: the echo came back changed")

        return run

    cases["rtt-64B"]["ferry.Pipe"] = Contender(ferry_rtt(False), fpeer.start, fpeer.stop)
    cases["rtt-24.9MB"]["ferry.Pipe"] = Contender(ferry_rtt(True), fpeer.start, fpeer.stop)
    cleanup.append(fpeer.stop)

    # multiprocessing.shared_memory + multiprocessing.Pipe: a fresh peer for every turn too
    ctx = mp.get_context("spawn")
    speer = StdlibPeer(ctx)
    segs = {}
    for label, arr in (("rtt-64B", small), ("rtt-24.9MB", big)):
        seg = shared_memory.SharedMemory(create=True, size=arr.nbytes)
        view: np.ndarray[Any, Any] = np.ndarray(arr.shape, arr.dtype, buffer=seg.buf)
        view[...] = arr
        segs[label] = (seg, view)

        def std_rtt(
            seg: shared_memory.SharedMemory = seg, view: np.ndarray[Any, Any] = view
        ) -> None:
            mine = speer.conn
            assert mine is not None
            mine.send((seg.name, view.shape, view.dtype.str))
            _, shape, dtype = mine.recv()
            back: np.ndarray[Any, Any] = np.ndarray(shape, dtype, buffer=seg.buf)
            if back.nbytes != view.nbytes:
                raise SystemExit("stdlib: the echo came back changed")

        cases[label]["shm+mp.Pipe"] = Contender(std_rtt, speer.start, speer.stop)

    def std_bye() -> None:
        speer.stop()
        for seg, view in segs.values():
            del view
            seg.close()
            seg.unlink()

    cleanup.append(std_bye)

    # iceoryx2
    try:
        import iceoryx2  # noqa: F401

        cleanup.append(iox_leftovers_remover())

        for mode in ("poll", "event"):
            itag = f"{tag}-{mode}"
            peer = procs.start(me("--peer", "iox", itag, mode), "ready", stdin=True)
            client = IoxClient(itag, mode)
            park = np.array([PARK], np.uint8)
            stop = np.array([STOP], np.uint8)
            for label, arr in (("rtt-64B", small), ("rtt-24.9MB", big)):
                ptr, n = arr.ctypes.data, arr.nbytes

                def wake(peer: subprocess.Popen[str] = peer) -> None:
                    assert peer.stdin is not None
                    peer.stdin.write("go\n")
                    peer.stdin.flush()

                def sleep(client: IoxClient = client, park: Any = park) -> None:
                    client.rtt(park.ctypes.data, 1)

                def rtt(client: IoxClient = client, ptr: int = ptr, n: int = n) -> None:
                    client.rtt(ptr, n)

                parked = mode == "poll"
                cases[label][f"iceoryx2 {mode}"] = Contender(
                    rtt, wake if parked else None, sleep if parked else None
                )
            if mode == "poll":
                client.rtt(park.ctypes.data, 1)  # parked until its first turn

            def iox_bye(
                client: IoxClient = client,
                peer: subprocess.Popen[str] = peer,
                mode: str = mode,
                stop: Any = stop,
            ) -> None:
                if mode == "poll":
                    assert peer.stdin is not None
                    peer.stdin.write("go\n")
                    peer.stdin.flush()
                client.rtt(stop.ctypes.data, 1)

            cleanup.append(iox_bye)
    except ImportError as e:
        skipped.append(f"iceoryx2: not installed ({e}); `pip install iceoryx2` adds its rows")

    # torch.multiprocessing queues
    try:
        import torch
        import torch.multiprocessing as tmp

        tctx = tmp.get_context("spawn")
        q_in, q_out = tctx.Queue(), tctx.Queue()
        tproc = tctx.Process(target=torch_peer, args=(q_in, q_out), daemon=True)
        tproc.start()
        for label, arr in (("rtt-64B", small), ("rtt-24.9MB", big)):
            t = torch.from_numpy(arr.copy()).share_memory_()

            def torch_rtt(t: Any = t) -> None:
                q_in.put(t)
                back = q_out.get(timeout=60)
                if back.numel() != t.numel():
                    raise SystemExit("torch: the echo came back changed")

            cases[label]["torch.mp.Queue"] = Contender(torch_rtt)

        def torch_bye() -> None:
            q_in.put(None)
            tproc.join(10)

        cleanup.append(torch_bye)
    except ImportError as e:
        skipped.append(f"torch.multiprocessing: torch not importable ({e})")

    rows: list[Row] = []
    try:
        rows += interleave("rtt-64B", cases["rtt-64B"], a.iters, a.rounds)
        rows += interleave("rtt-24.9MB", cases["rtt-24.9MB"], a.big_iters, a.rounds)
    finally:
        for f in cleanup:
            try:
                f()
            except Exception as e:  # report, and stop the others anyway
                print(f"(cleanup: {e})", file=sys.stderr)
    return rows


def rpc(a: argparse.Namespace, procs: Procs, tag: str, ferry_bin: str) -> list[Row]:
    rust_addr, py_addr = f"unix:ferry-bench-rs-{tag}", f"unix:ferry-bench-app-{tag}"
    procs.start([ferry_bin, "serve", rust_addr], "listening on")
    procs.start(
        [sys.executable, "-m", "ferry", "serve", "bench_app:app", py_addr], "listening on", cwd=HERE
    )
    from multiprocessing.connection import Client as StdlibClient

    std_path = os.path.join(tempfile.mkdtemp(prefix="ferry-bench-"), "stdlib-rpc.sock")
    procs.start(me("--peer", "stdlib-rpc", std_path), "listening on")
    rs, py = ferry.Client.connect(rust_addr), ferry.Client.connect(py_addr)
    std = StdlibClient(std_path, "AF_UNIX")

    def std_add() -> Any:
        std.send(("add", (1, 2)))
        return std.recv()

    try:
        fadd = py.functions.add
        assert rs.call("add", [1, 2]) == py.call("add", [1, 2]) == fadd(1, 2) == std_add() == 3
        rows = interleave(
            "add",
            {
                "rust-served": Contender(lambda: rs.call("add", [1, 2])),
                "ferry.App": Contender(lambda: py.call("add", [1, 2])),
                "ferry.App functions.add": Contender(lambda: fadd(1, 2)),
                "stdlib mp.connection": Contender(std_add),
            },
            a.iters,
            a.rounds,
        )
        std.close()  # its server ends: the echo rows run beside no third process
        x_rs, x_py = rs.alloc(SHAPE, "f32"), py.alloc(SHAPE, "f32")
        x_rs[...] = 1.0
        x_py[...] = 1.0
        rows += interleave(
            "echo-24.9MB",
            {
                "rust-served": Contender(lambda: rs.call("echo", {"tensor": x_rs})),
                "ferry.App": Contender(lambda: py.call("echo", {"tensor": x_py})),
            },
            a.big_iters,
            a.rounds,
        )
        return rows
    finally:
        rs.close()
        py.close()
        std.close()
        # The socket file, whether or not its server unlinked it yet, and its directory.
        shutil.rmtree(os.path.dirname(std_path), ignore_errors=True)


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def verdicts(rows: list[Row], load: int) -> list[str]:
    by = {(r.case, r.who): r for r in rows}
    out = ["", "ratios (p50 unless said; same run):"]

    def get(case: str, who: str) -> Row | None:
        r = by.get((case, who))
        return r if r is not None and r.samples else None

    def check(
        what: str, a: tuple[str, str], b: tuple[str, str], limit: float, q: float = 0.5
    ) -> None:
        ra, rb = get(*a), get(*b)
        if ra is None or rb is None:
            out.append(f"  {what}: not measured ({'/'.join(x[1] for x in (a, b))} missing)")
            return
        ratio = ra.p(q) / rb.p(q)
        ok = "MET" if ratio <= limit else "MISSED"
        qs = "p50" if q == 0.5 else "p99"
        target = f"(target <= {limit:g}: {ok})"
        out.append(f"  {what}: {a[1]} {a[0]} / {b[1]} {b[0]} {qs} = {ratio:.2f}  {target}")

    if load == 0:
        check("quiet", ("rtt-64B", "ferry.Pipe"), ("rtt-64B", "shm+mp.Pipe"), 0.25)
        check("quiet", ("rtt-64B", "ferry.Pipe"), ("rtt-64B", "iceoryx2 poll"), 1.0)
        check("quiet", ("rtt-24.9MB", "ferry.Pipe"), ("rtt-64B", "ferry.Pipe"), 1.2)
        check("quiet", ("add", "ferry.App"), ("add", "rust-served"), 1.2)
    # No target of the issue's: the Python-served call against what a Python user would
    # write instead, in the same run.
    app, std = get("add", "ferry.App"), get("add", "stdlib mp.connection")
    if app is not None and std is not None:
        what = "quiet" if load == 0 else f"load {load}"
        for q in (0.5, 0.99):
            qs = "p50" if q == 0.5 else "p99"
            ratio = app.p(q) / std.p(q)
            out.append(f"  {what}: ferry.App add / stdlib mp.connection add {qs} = {ratio:.2f}")
    if load:
        for case in ("rtt-64B", "rtt-24.9MB"):
            check(f"load {load}", (case, "ferry.Pipe"), (case, "shm+mp.Pipe"), 1.0)
            check(f"load {load}", (case, "ferry.Pipe"), (case, "shm+mp.Pipe"), 2.0, q=0.99)
    out.append("  other ratios to ferry.Pipe / rust-served (p50):")
    for r in rows:
        base = get(r.case, "ferry.Pipe") or get(r.case, "rust-served")
        if base is not None and base is not r:
            out.append(f"    {r.case:<12} {r.who:<24} {r.p(0.5) / base.p(0.5):7.2f}x {base.who}")
    return out


def burners(n: int, procs: Procs, ferry_bin: str) -> None:
    for _ in range(n):
        procs.start([ferry_bin, "__burn"], "burning", stdin=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--iters", type=int, default=3000, help="timed 64 B round trips and adds per contender"
    )
    ap.add_argument(
        "--big-iters",
        type=int,
        default=3000,
        help="timed 24.9 MB round trips per contender (as many as --iters: see WARMUP)",
    )
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--load", type=int, default=0, help="CPU burners (nice 0) beside the benchmark")
    ap.add_argument("--peer", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        kind, *rest = a.peer
        if kind == "ferry":
            ferry_peer(rest[0])
        elif kind == "iox":
            iox_peer(rest[0], rest[1])
        elif kind == "stdlib-rpc":
            stdlib_rpc_server(rest[0])
        return
    ferry_bin = os.environ.get("FERRY_BIN")
    if not ferry_bin:
        raise SystemExit(
            "set FERRY_BIN to a release `ferry` binary (cargo xtask bench-python does)"
        )
    tag = str(os.getpid())
    procs, load_procs = Procs(), Procs()
    skipped: list[str] = []
    before = loadavg()
    try:
        burners(a.load, load_procs, ferry_bin)
        if a.load:
            print(
                f"load: {a.load} CPU burners (`ferry __burn`, nice 0) running beside the benchmark"
            )
        rows = pipes(a, procs, tag, skipped)
        rows += rpc(a, procs, tag, ferry_bin)
    finally:
        procs.stop()
        load_procs.stop()
    cpus = os.cpu_count()
    after = loadavg()
    print(
        f"bench-python: {cpus} CPUs, --load {a.load}, load average before {before}, after {after}"
    )
    print(f"{'case':<12} {'contender':<24} {'p50 us':>10} {'p99 us':>10} {'n':>6}")
    for r in rows:
        print(f"{r.case:<12} {r.who:<24} {r.p(0.5):10.1f} {r.p(0.99):10.1f} {len(r.samples):6d}")
    for r in rows:
        if r.case.startswith("rtt-") and r.startup:
            print(startup_line(r))
    for s in skipped:
        print(f"skipped: {s}")
    for line in verdicts(rows, a.load):
        print(line)


def startup_line(r: Row) -> str:
    """A fresh pair's first round trips (untimed in the table): the median of each
    position over the turns, the first five, and the slowest of all."""
    n = min(len(t) for t in r.startup)
    med = [statistics.median(t[i] for t in r.startup) * 1e6 for i in range(min(n, 5))]
    worst = max(max(t) for t in r.startup) * 1e6
    firsts = " ".join(f"{x:.0f}" for x in med)
    return (
        f"start-up {r.case:<11} {r.who:<22} first round trips, median of {len(r.startup)} "
        f"turns: {firsts} us; slowest {worst:.0f} us"
    )


if __name__ == "__main__":
    main()
