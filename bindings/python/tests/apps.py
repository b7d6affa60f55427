"""Apps the tests serve in child processes (`ferry.spawn`, `python -m ferry serve
tests.apps:app`).

Handlers that the tests observe from outside (cancellation, concurrency, hung calls) keep
their state in module-level tables of the serving process, read back through other
methods of the same app (`record`, `max_seen`, ...): a test never relies on timing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import threading
import time
from typing import Any, Literal, Optional

import numpy as np
import pydantic
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

import ferry

app = ferry.App("ferrytest", version="1.2.3", description="The test suite's app.")
debug_app = ferry.App("ferrytest-debug", debug=True)

LONG = 60.0
"""Seconds a handler waits at most for what a test makes happen (then it gives up, so
a broken test never leaves a process behind for long)."""

# ---- state observable through other calls ----------------------------------------------

_lock = threading.Lock()
_records: dict[str, str] = {}
_events: dict[str, threading.Event] = {}
_barriers: dict[str, threading.Barrier] = {}
_running: dict[str, int] = {}
_max_running: dict[str, int] = {}
_kept: dict[str, np.ndarray] = {}


def _event(key: str) -> threading.Event:
    with _lock:
        return _events.setdefault(key, threading.Event())


def _note(key: str, value: str) -> None:
    with _lock:
        _records[key] = value


@app.function
def record(key: str) -> str | None:
    """What a handler wrote under `key` (None: nothing yet)."""
    with _lock:
        return _records.get(key)


@app.function
def release(key: str) -> bool:
    """Lets the handlers waiting on `key` go on."""
    _event(key).set()
    return True


@app.function
def pid() -> int:
    return os.getpid()


@app.function
def peer(ctx: ferry.Context) -> dict[str, Any]:
    return ctx.peer


@app.function
def memfd_fds() -> int:
    """Descriptors of this process that are memfds (shared memory segments)."""
    return _count_memfd(os.getpid())


def _count_memfd(p: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{p}/fd"):
        try:
            if os.readlink(f"/proc/{p}/fd/{fd}").startswith("/memfd:"):
                n += 1
        except OSError:
            pass  # closed meanwhile
    return n


# ---- params and results ----------------------------------------------------------------


@app.function
def add(a: float, b: float) -> float:
    """Adds two numbers.

    The rest of the docstring is the description."""
    return a + b


@app.function
def greet(name: str, greeting: str = "hello", times: int = 1) -> str:
    return " ".join([f"{greeting} {name}"] * times)


@dataclasses.dataclass
class Point:
    x: int
    y: int


@app.function
def norm(p: Point, mode: Literal["l1", "l2"] = "l1") -> float:
    return float(abs(p.x) + abs(p.y)) if mode == "l1" else math.hypot(p.x, p.y)


@app.function
def shift(points: list[Point], by: Point) -> list[Point]:
    return [Point(p.x + by.x, p.y + by.y) for p in points]


class Box(TypedDict):
    w: float
    h: float
    label: str


@app.function
def grow(box: Box, k: float = 2.0) -> Box:
    return {"w": box["w"] * k, "h": box["h"] * k, "label": box["label"].upper()}


@app.function
def maybe(x: Optional[int] = None) -> Optional[int]:  # noqa: UP045 - on purpose
    return None if x is None else x * 10


@app.function
def totals(groups: dict[str, list[int]]) -> dict[str, int]:
    return {k: sum(v) for k, v in groups.items()}


class Item(pydantic.BaseModel):
    name: str
    qty: int = 1
    price: float


class Order(pydantic.BaseModel):
    items: list[Item]
    note: str | None = None
    tags: dict[str, list[str]] = {}


class Receipt(pydantic.BaseModel):
    total: float
    count: int
    names: list[str]
    note: str | None


@app.function
def checkout(order: Order) -> Receipt:
    return Receipt(
        total=sum(i.qty * i.price for i in order.items),
        count=sum(i.qty for i in order.items),
        names=[i.name for i in order.items],
        note=order.note,
    )


@app.function
def untyped(a, b=None):  # type: ignore[no-untyped-def]  # no hints: any JSON in and out
    return {"a": a, "b": b}


# ---- tensors -----------------------------------------------------------------------------


def mapping_of(a: np.ndarray) -> str:
    """The path of the mapping of this process holding `a`'s first byte ("" if none)."""
    ptr = a.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(v, 16) for v in parts[0].split("-"))
            if lo <= ptr < hi:
                return parts[5].strip() if len(parts) > 5 else ""
    return ""


def _base_chain(a: object) -> list[str]:
    chain = []
    b: object = a
    while b is not None and len(chain) < 10:
        chain.append(f"{type(b).__module__}.{type(b).__qualname__}")
        b = getattr(b, "base", None)
    return chain


@app.function
def inspect_array(x: np.ndarray) -> dict[str, Any]:
    """How the handler sees a received tensor."""
    wrote = "yes"
    try:
        x[...] = 0
    except ValueError:
        wrote = "refused"
    return {
        "writeable": bool(x.flags.writeable),
        "chain": _base_chain(x),
        "dtype": str(x.dtype),
        "shape": list(x.shape),
        "mapping": mapping_of(x) if x.size else "",
        "wrote": wrote,
        "sum": float(np.asarray(x, dtype=np.float64).sum()),
    }


@app.function
def scale(x: np.ndarray, k: float = 2.0) -> np.ndarray:
    out = ferry.empty(x.shape, x.dtype)
    np.multiply(x, k, out=out)
    return out


@app.function
def scale_ctx(x: np.ndarray, ctx: ferry.Context, k: float = 2.0) -> np.ndarray:
    out = ctx.alloc(x.shape, x.dtype)
    np.multiply(x, k, out=out)
    return out


@app.function
def copy_of(x: np.ndarray) -> np.ndarray:
    """An ordinary array (copied into the connection's memory on the way out)."""
    return np.array(x, copy=True)


@app.function
def alloc_copy(x: np.ndarray) -> np.ndarray:
    out = ferry.empty(x.shape, x.dtype)
    out[...] = x
    return out


@app.function
def echo(x: np.ndarray) -> np.ndarray:
    return x


@app.function
def swap(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """Both received tensors sent back, in the other order."""
    return [b, a]


@app.function
def transposed(x: np.ndarray) -> np.ndarray:
    """A non-contiguous view (copied out)."""
    return x.T


@app.function
def bundle(x: np.ndarray):  # type: ignore[no-untyped-def]  # unannotated result
    return {"twice": x * 2, "parts": [x[:1].copy(), {"last": x[-1:].copy()}], "n": int(x.size)}


@app.function
def bundle_typed(xs: list[np.ndarray]) -> dict[str, Any]:
    return {"sums": [float(x.sum()) for x in xs], "stacked": np.stack(xs), "first": xs[0]}


@app.function
def tensor_list(xs: list[np.ndarray], k: float) -> list[np.ndarray]:
    return [x * k for x in xs]


@app.function
def tensor_map(m: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v + 1 for k, v in m.items()}


@app.function
def optional_tensors(
    x: Optional[np.ndarray] = None,  # noqa: UP045 - typing.Optional on purpose
    y: np.ndarray | None = None,
) -> Optional[np.ndarray]:  # noqa: UP045
    """`typing.Optional` and `X | None` of tensors."""
    given = [a for a in (x, y) if a is not None]
    return sum(given[1:], given[0].copy()) if given else None


class Sample(pydantic.BaseModel):
    x: ferry.NDArray
    label: str


@app.function
def relabel(s: Sample, suffix: str) -> Sample:
    return Sample(x=s.x * 2, label=s.label + suffix)


@dataclasses.dataclass
class Frame:
    """A plain dataclass with a numpy field (no `ferry.NDArray` needed)."""

    pixels: np.ndarray
    gain: float = 1.0

    def brightness(self) -> float:
        return float(self.pixels.mean()) * self.gain


class Pair(TypedDict):
    left: np.ndarray
    right: np.ndarray


@app.function
def brighten(frame: Frame, pair: Pair) -> Frame:
    """Tensors inside a dataclass and a TypedDict, in and out; the handler gets the
    user's own class (its methods work)."""
    assert isinstance(frame, Frame), type(frame)
    assert not frame.pixels.flags.writeable  # a received, read-only view
    level = frame.brightness()
    return Frame(pixels=pair["left"] + pair["right"] + level, gain=frame.gain * 2)


@app.function
def kept_shared(key: str, n: int) -> np.ndarray:
    """A result in the connection's memory, kept here to be changed later (`poke`)."""
    out = ferry.empty((n,), "f32")
    out[...] = 1.0
    _kept[key] = out
    return out


@app.function
def kept_copied(key: str, n: int) -> np.ndarray:
    """An ordinary array result, kept here to be changed later (`poke`)."""
    a = np.ones(n, np.float32)
    _kept[key] = a
    return a


@app.function
def poke(key: str, value: float) -> bool:
    _kept[key][...] = value
    return True


@app.function
def viewed_as_int() -> np.ndarray:
    """An f32 result buffer returned as an int32 view of the same bytes."""
    out = ferry.empty((4,), "f32")
    out[...] = 1.0
    return out.view(np.int32)


# ---- cancellation, concurrency, hung calls -----------------------------------------------


@app.function
def spin(key: str, ctx: ferry.Context) -> str:
    """Loops until cancelled; notes how it ended."""
    _note(key, "running")
    deadline = time.monotonic() + LONG
    while not ctx.cancelled and time.monotonic() < deadline:
        time.sleep(0.005)
    _note(key, "cancelled" if ctx.cancelled else "gave up")
    return "finished"


@app.function
def wait_cancel(key: str, ctx: ferry.Context) -> str:
    _note(key, "running")
    got = ctx.wait_cancelled(LONG)
    _note(key, "cancelled" if got and ctx.cancelled else "gave up")
    return "finished"


@app.function
async def sleeper(key: str) -> str:
    _note(key, "running")
    try:
        await asyncio.sleep(LONG)
    except asyncio.CancelledError:
        _note(key, "cancelled")
        raise
    _note(key, "gave up")
    return "finished"


@app.function
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@app.function
async def async_scale(x: np.ndarray, k: float) -> np.ndarray:
    await asyncio.sleep(0)
    out = ferry.empty(x.shape, x.dtype)
    np.multiply(x, k, out=out)
    return out


def _enter(key: str) -> None:
    with _lock:
        n = _running.get(key, 0) + 1
        _running[key] = n
        _max_running[key] = max(_max_running.get(key, 0), n)


def _leave(key: str) -> None:
    with _lock:
        _running[key] -= 1


@app.function(concurrency=1)
def capped(key: str, hold: float) -> int:
    """Counts how many calls are inside at once (at most one, by the cap)."""
    _enter(key)
    try:
        time.sleep(hold)
    finally:
        _leave(key)
    return 1


@app.function
def gather(key: str, n: int) -> bool:
    """Returns once `n` calls are inside at once (False if they never were)."""
    with _lock:
        b = _barriers.setdefault(key, threading.Barrier(n))
    _enter(key)
    try:
        b.wait(LONG)
        return True
    except threading.BrokenBarrierError:
        return False
    finally:
        _leave(key)


@app.function
def max_seen(key: str) -> int:
    with _lock:
        return _max_running.get(key, 0)


@app.function
def hang(key: str) -> str:
    """Blocks (without looking at cancellation) until `release(key)`."""
    _note(key, "running")
    released = _event(key).wait(LONG)
    _note(key, "released" if released else "gave up")
    return "released" if released else "gave up"


@app.function
def nap(key: str, seconds: float) -> str:
    """Sleeps, deaf to cancellation."""
    _note(key, "running")
    time.sleep(seconds)
    _note(key, "woke")
    return "woke"


@app.function
def fill(key: str, n: int) -> np.ndarray:
    """A result of `n` bytes from `ferry.empty` (which waits while the pool is full)."""
    _note(key, "allocating")
    try:
        out = ferry.empty((n,), "u8")
    except Exception as e:
        _note(key, f"alloc failed: {type(e).__name__}: {e}")
        raise
    _note(key, "allocated")
    out[...] = 1
    return out


@app.function(task=True)
def gated_sum(key: str, xs: list[float]) -> float:
    """Waits for `release(key)`, then sums."""
    _note(key, "running")
    _event(key).wait(LONG)
    return float(sum(xs))


@app.function
async def async_gated(key: str, x: np.ndarray) -> dict[str, Any]:
    _note(key, "running")
    while not _event(key).is_set():
        await asyncio.sleep(0.01)
    return {"sum": float(x.sum()), "double": x * 2}


# ---- errors --------------------------------------------------------------------------------


@app.function
def fail_rpc(code: int, message: str, data: Any = None) -> None:
    raise ferry.RpcError(code, message, data)


@app.function
def crash(x: int) -> int:
    return x // 0


@app.function
async def async_crash() -> int:
    await asyncio.sleep(0)
    raise LookupError("no such thing")


@app.function
def result_set():  # type: ignore[no-untyped-def]
    return {1, 2}


@app.function
def result_object() -> dict[str, Any]:
    return {"o": object()}


class Opaque:
    pass


@app.function
def result_opaque():  # type: ignore[no-untyped-def]
    return [Opaque()]


@app.function
def result_wrong_type() -> int:
    return "not an int"  # type: ignore[return-value]


@app.function
def result_nan() -> float:
    return math.nan


@app.function
def result_nan_untyped():  # type: ignore[no-untyped-def]
    return {"x": [1.0, math.nan]}


@app.function
def result_inf_in_dict() -> dict[str, Any]:
    return {"x": [1.0, math.inf]}


@app.function
def result_str_array() -> np.ndarray:
    return np.array(["a", "b"])


@debug_app.function
def debug_crash(x: int) -> int:
    return x // 0
