"""ferry's cuda-ipc path from Python, between two real processes on a real GPU.

Not a pytest module and not run in CI (CI has no GPU; the same logic runs there against
the simulated GPU: tests/test_cuda.py, tests/client/test_cuda.py). Run it where a GPU is
lent, with the `ferry-tensors` package installed (a wheel: no Rust toolchain needed),
torch with CUDA and CuPy:

    python tests/gpu/check_cuda.py            # exit status 0: every check passed

Two processes (multiprocessing, `spawn`: CUDA does not survive `fork`):

1. `ferry.Pipe`: the producer sends a CUDA torch tensor, a CuPy array, a bf16 torch
   tensor and a tensor from `Pipe.alloc_device` (through a torch view of it); the consumer
   checks every byte through `torch.from_dlpack`, `torch.as_tensor(..., device="cuda")` and
   `cupy.asarray`, that each of those views has the `DeviceTensor`'s address (no copy on
   the receiving side), that `alloc_device` was lent without any copy (a write the producer
   makes afterwards shows through the consumer's mapping), that a torch view of a received
   tensor sent back is the producer's own memory (no copy), and that every lease comes
   back once the consumer drops them.
2. `ferry.App` / `ferry.Client`: CUDA torch params, `Context.alloc_device` results,
   `as_torch=True` giving torch CUDA tensors.

It prints one line per check and a summary.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import secrets
import sys
import time
import traceback
from typing import Any

# At the top level: the served functions' type hints name torch.Tensor, and ferry resolves
# hints in the module's namespace (ferry.Context too).
import torch

import ferry

WAIT = 60.0


def _check(results: list[tuple[str, bool, str]], name: str, ok: bool, detail: str = "") -> None:
    results.append((name, bool(ok), detail))


def _until(check: Any, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


# ---- 1. ferry.Pipe ---------------------------------------------------------------------


def producer(addr: str, out: Any) -> None:
    results: list[tuple[str, bool, str]] = []
    try:
        import cupy
        import torch

        import ferry

        listener = ferry.listen(addr)
        out.put(("listening", None))
        p = listener.accept(WAIT)
        _check(
            results,
            "pipe negotiated cuda-ipc",
            p.device_channel == "cuda-ipc",
            str(p.device_channel),
        )
        frame = torch.arange(1920 * 1080 * 3, dtype=torch.float32, device="cuda").reshape(
            1920, 1080, 3
        )
        p.send({"case": "torch"}, [frame])
        p.send({"case": "cupy"}, [cupy.arange(1000, dtype=cupy.float16)])
        b = torch.linspace(-3, 3, 64, device="cuda").to(torch.bfloat16)
        p.send({"case": "bf16"}, [b])
        copies = p.stats()["cuda-ipc"]["copies_in"]
        _check(
            results,
            "torch, CuPy, bf16: one device copy each into the pool",
            copies == 3,
            str(copies),
        )
        t = p.alloc_device((256, 256), "f32")
        view = torch.as_tensor(t, device="cuda")
        _check(results, "torch view of alloc_device is zero-copy", view.data_ptr() == t.data_ptr)
        view.fill_(3.0)
        torch.cuda.synchronize()
        p.send({"case": "alloc"}, [view])  # the torch view: recognised as the allocation
        _check(
            results,
            "alloc_device sent without a copy",
            p.stats()["cuda-ipc"]["copies_in"] == copies,
            str(p.stats()["cuda-ipc"]),
        )
        p.recv(WAIT)  # the consumer holds it
        view.fill_(5.0)  # breaking the contract on purpose: the consumer must see it
        torch.cuda.synchronize()
        p.send({"case": "rewritten"}, [])
        _, (back,) = p.recv(WAIT)
        _check(
            results,
            "a torch view of a received tensor, sent back, is the producer's own memory",
            back.data_ptr == t.data_ptr,
        )
        back_t = torch.from_dlpack(back)
        _check(results, "its bytes", bool((back_t == 5.0).all()))
        del back, back_t
        p.send({"case": "done"}, [])
        p.recv(WAIT)  # the consumer dropped everything
        gc.collect()
        ok = _until(lambda: p.stats()["cuda-ipc"]["leases_granted"] == 0)
        _check(results, "every lease came back once the consumer dropped them", ok, str(p.stats()))
        p.close()
    except BaseException:
        _check(results, "producer ran", False, traceback.format_exc())
    out.put(("producer", results))


def consumer(addr: str, out: Any) -> None:
    results: list[tuple[str, bool, str]] = []
    try:
        import cupy
        import torch

        import ferry

        p = ferry.connect(addr)
        held: list[Any] = []
        for _ in range(4):
            header, (got,) = p.recv(WAIT)
            case = header["case"]
            _check(results, f"{case}: a received DeviceTensor", isinstance(got, ferry.DeviceTensor))
            dl = torch.from_dlpack(got)
            ca = torch.as_tensor(got, device="cuda")
            cp = cupy.asarray(got)
            same = dl.data_ptr() == ca.data_ptr() == int(cp.data.ptr) == got.data_ptr
            _check(results, f"{case}: torch (DLPack, CAI) and CuPy views at its address", same)
            if case == "torch":
                want = torch.arange(1920 * 1080 * 3, dtype=torch.float32, device="cuda")
                _check(results, "torch: every byte", bool(torch.equal(dl.reshape(-1), want)))
            elif case == "cupy":
                _check(
                    results,
                    "cupy: every byte",
                    bool((cp == cupy.arange(1000, dtype=cupy.float16)).all()),
                )
            elif case == "bf16":
                want = torch.linspace(-3, 3, 64, device="cuda").to(torch.bfloat16)
                _check(
                    results,
                    "bf16: dtype and bytes",
                    dl.dtype == torch.bfloat16 and bool(torch.equal(dl, want)),
                )
            elif case == "alloc":
                _check(results, "alloc: bytes", bool((dl == 3.0).all()))
                held.append(got)
                p.send({"holding": True}, [])
                p.recv(WAIT)  # rewritten
                torch.cuda.synchronize()
                _check(
                    results,
                    "alloc: the producer's later write shows (same memory)",
                    bool((dl == 5.0).all()),
                )
                p.send({"back": True}, [dl])  # the torch view: goes back by reference
                st = p.stats()["cuda-ipc"]
                _check(
                    results,
                    "alloc: the view went back as a reference, not a copy",
                    st["copies_in"] == 0 and st["returns_sent"] == 1,
                    str(st),
                )
            del dl, ca, cp
        p.recv(WAIT)  # done
        held.clear()
        del got
        gc.collect()
        p.send({"dropped": True}, [])
        time.sleep(0.5)
        p.close()
    except BaseException:
        _check(results, "consumer ran", False, traceback.format_exc())
    out.put(("consumer", results))


# ---- 2. ferry.App and ferry.Client -----------------------------------------------------


def serve_app(addr: str, out: Any) -> None:
    try:
        import ferry

        app = ferry.App("gpu-check")

        @app.function
        def twice(x: torch.Tensor, ctx: ferry.Context) -> Any:
            # x: a torch CUDA tensor over the caller's memory (annotated torch.Tensor)
            out_t = ctx.alloc_device(list(x.shape), x.dtype)
            v = torch.as_tensor(out_t, device=f"cuda:{out_t.device_index}")
            torch.mul(x, 2, out=v)
            torch.cuda.synchronize()
            return v  # a view of the allocation: goes back without a copy

        @app.function
        def info(x: torch.Tensor) -> dict[str, Any]:
            return {"is_cuda": bool(x.is_cuda), "sum": float(x.float().sum())}

        app.serve(addr, announce=False, ready=lambda _: out.put(("listening", None)))
    except BaseException:
        out.put(("server", [("server ran", False, traceback.format_exc())]))


def call_app(addr: str, out: Any) -> None:
    results: list[tuple[str, bool, str]] = []
    try:
        import torch

        import ferry

        with ferry.Client.connect(addr, timeout=WAIT, as_torch=True) as c:
            _check(results, "client negotiated cuda-ipc", c.device_channel == "cuda-ipc")
            x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
            got = c.call("info", {"x": x})
            _check(results, "a CUDA torch param arrives as torch CUDA", got["is_cuda"], str(got))
            _check(results, "its bytes", got["sum"] == float(x.sum()), str(got))
            y = c.call("twice", {"x": x})
            _check(
                results, "as_torch: a torch CUDA result", isinstance(y, torch.Tensor) and y.is_cuda
            )
            _check(results, "its bytes", bool(torch.equal(y, x * 2)))
            a = c.alloc_device((1 << 20,), "f32")
            av = torch.as_tensor(a, device="cuda")
            av.copy_(x)
            torch.cuda.synchronize()
            y2 = c.call("twice", {"x": av})
            _check(results, "an alloc_device param", bool(torch.equal(y2, x * 2)))
    except BaseException:
        _check(results, "client ran", False, traceback.format_exc())
    out.put(("client", results))


def _run_pair(first: Any, second: Any, tag: str) -> list[tuple[str, bool, str]]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    addr = f"unix:ferry-gpu-check-{tag}-{os.getpid()}-{secrets.token_hex(4)}"
    a = ctx.Process(target=first, args=(addr, q))
    a.start()
    kind, payload = q.get(timeout=WAIT)
    if kind != "listening":
        return list(payload)
    b = ctx.Process(target=second, args=(addr, q))
    b.start()
    results: list[tuple[str, bool, str]] = []
    for _ in range(2 if first is producer else 1):
        _, payload = q.get(timeout=WAIT * 2)
        results.extend(payload)
    b.join(WAIT)
    if first is serve_app:
        a.terminate()
    a.join(WAIT)
    return results


def main() -> int:
    import ferry

    print(f"ferry {ferry.__version__}, Python {sys.version.split()[0]}")
    results = _run_pair(producer, consumer, "pipe") + _run_pair(serve_app, call_app, "app")
    width = max(len(n) for n, _, _ in results)
    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name:<{width}} {detail if not ok else ''}".rstrip())
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
