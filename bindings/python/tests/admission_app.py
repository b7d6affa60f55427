"""The app of `test_admission.py`: handlers that record when they start and how many run
at once, served by that test with small limits (`max_running_handlers`, ...). The
functions that read the records are async: they need no handler thread, so a test can
look while every thread is held."""

from __future__ import annotations

import threading

from pydantic import BaseModel

import ferry

app = ferry.App("ferry-admission")

LONG = 60.0
"""Seconds a handler blocks at most (a broken test leaves nothing behind for long)."""

_lock = threading.Lock()
_starts: dict[str, int] = {}
_running: dict[str, int] = {}
_max: dict[str, int] = {}
_events: dict[str, threading.Event] = {}


def _event(key: str) -> threading.Event:
    with _lock:
        return _events.setdefault(key, threading.Event())


def _enter(key: str) -> None:
    with _lock:
        _starts[key] = _starts.get(key, 0) + 1
        n = _running.get(key, 0) + 1
        _running[key] = n
        _max[key] = max(_max.get(key, 0), n)


def _leave(key: str) -> None:
    with _lock:
        _running[key] -= 1


@app.function
def block(key: str) -> str:
    """Counts its start, then blocks (deaf to cancellation) until `release(key)`."""
    _enter(key)
    try:
        return "released" if _event(key).wait(LONG) else "gave up"
    finally:
        _leave(key)


@app.function
async def release(key: str) -> bool:
    _event(key).set()
    return True


@app.function
async def starts(key: str) -> int:
    """How many handlers of `key` started."""
    with _lock:
        return _starts.get(key, 0)


@app.function
async def running(key: str) -> int:
    """How many handlers of `key` run now."""
    with _lock:
        return _running.get(key, 0)


@app.function
async def max_running(key: str) -> int:
    """The most handlers of `key` that ran at once."""
    with _lock:
        return _max.get(key, 0)


@app.function
def add(a: float, b: float) -> float:
    return a + b


class Point(BaseModel):
    x: float
    y: float


@app.function
def total(key: str, xs: list[float], hold: float = 0.0) -> float:
    """The sum of `xs` (counted as running for `hold` seconds)."""
    _enter(key)
    try:
        _event(key).wait(hold)
        return sum(xs)
    finally:
        _leave(key)


@app.function
def centroid(points: list[Point], scale: tuple[float, float] = (1.0, 1.0)) -> Point:
    n = len(points) or 1
    return Point(
        x=sum(p.x for p in points) / n * scale[0], y=sum(p.y for p in points) / n * scale[1]
    )
