"""A simulated GPU for the cuda-ipc tests on machines without one.

`ferry._native` built with the test-only cargo feature `__testing` (what `cargo xtask
python-server` installs in its test venv) has `_FakeGpu`: the in-memory CUDA driver of
ferry-cuda-ipc (`fake.rs`: devices with UUIDs, IPC handles that only another process may
open, mappings counted), as simulated *processes* of one simulated GPU, all in this one
real process. `proc.activate()` makes the channels built from then on (a `ferry.listen`,
`ferry.connect`, `Client.connect`, `App.serve`) use that process's driver, so the two ends
of one pipe are two simulated processes and negotiate cuda-ipc as two real ones would.

A release wheel (`cargo xtask python-wheel`) has no `_FakeGpu`: the tests that need it are
skipped, with `SKIP_REASON`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import ferry
from ferry import _native
from tests.conftest import WAIT, unique_addr

FAKE = hasattr(_native, "_FakeGpu")
"""Whether this build has the simulated GPU."""

SKIP_REASON = (
    "this ferry._native was built without the test-only cargo feature `__testing` (a "
    "release wheel has no simulated GPU): the cuda-ipc tests run in the dev build of "
    "`cargo xtask python-server`, and on a real GPU with tests/gpu/check_cuda.py"
)


def simulated_gpu() -> Iterator[Any]:
    """A simulated machine with one GPU (for a fixture: `yield from`); channels use the
    real driver again after."""
    if not FAKE:
        pytest.skip(SKIP_REASON)
    g = _native._FakeGpu(1)  # type: ignore[attr-defined]
    try:
        yield g
    finally:
        _native._fake_cuda_deactivate()  # type: ignore[attr-defined]


def deactivate() -> None:
    """Channels built from now on use the real driver."""
    _native._fake_cuda_deactivate()  # type: ignore[attr-defined]


class FakeDeviceArray:
    """A CUDA array in a simulated process's device memory, exposing
    `__cuda_array_interface__` (v3) and `__dlpack_device__` as CuPy does: what a user's
    CuPy array or numba array is to ferry."""

    def __init__(
        self,
        proc: Any,
        data: np.ndarray[Any, Any],
        *,
        typestr: str | None = None,
        strides: tuple[int, ...] | None = None,
        mask: object = None,
        nbytes: int | None = None,
    ) -> None:
        self.proc = proc
        self.shape = tuple(data.shape)
        self.typestr = typestr or data.dtype.str
        self.strides = strides
        self.mask = mask
        raw = np.ascontiguousarray(data).tobytes()
        self.nbytes = nbytes if nbytes is not None else len(raw)
        self.ptr = int(proc.alloc(max(self.nbytes, 1)))
        proc.write(self.ptr, raw.ljust(self.nbytes, b"\0")[: self.nbytes])

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "version": 3,
            "shape": self.shape,
            "typestr": self.typestr,
            "data": (self.ptr, False),
            "strides": self.strides,
            "mask": self.mask,
            "stream": None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def free(self) -> None:
        self.proc.free(self.ptr)


def read(proc: Any, t: Any, dtype: Any = None) -> np.ndarray[Any, Any]:
    """The bytes a device tensor's `__cuda_array_interface__` points at, read through the
    driver of `proc` (the process it belongs to), as a numpy array of its shape."""
    cai = t.__cuda_array_interface__
    dt = np.dtype(dtype or cai["typestr"])
    shape = tuple(cai["shape"])
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize if cai.get("strides") is None else None
    if n is None:
        # A strided view: read the span and let numpy walk it.
        strides = tuple(cai["strides"])
        span = sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + dt.itemsize
        raw = proc.read(cai["data"][0], span)
        base = np.frombuffer(raw, dtype=np.uint8)
        return np.lib.stride_tricks.as_strided(base.view(dt), shape=shape, strides=strides)
    raw = proc.read(cai["data"][0], n)
    return np.frombuffer(raw, dtype=dt).reshape(shape)


@contextlib.contextmanager
def pipe_pair(a: Any, b: Any) -> Iterator[tuple[ferry.Pipe, ferry.Pipe]]:
    """A pipe between simulated processes `a` (the listening end, first) and `b`, closed
    after."""
    addr = unique_addr("cuda")
    a.activate()
    listener = ferry.listen(addr)
    b.activate()
    with ThreadPoolExecutor(1) as pool:
        accepted = pool.submit(listener.accept, WAIT)
        near = ferry.connect(addr)
        far = accepted.result(WAIT)
    deactivate()
    try:
        yield far, near
    finally:
        near.close()
        far.close()


@contextlib.contextmanager
def serving(app: ferry.App, proc: Any) -> Iterator[str]:
    """`app` served on a thread of this process as simulated process `proc`; its address."""
    addr = unique_addr("cuda-app")
    ready = threading.Event()
    proc.activate()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            app.serve(addr, announce=False, ready=lambda _: ready.set())
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
            ready.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(WAIT), "the app did not start"
    deactivate()
    assert not errors, errors
    try:
        yield addr
    finally:
        app.stop()
        t.join(WAIT)


def connect(addr: str, proc: Any, **opts: Any) -> ferry.Client:
    """A client of `addr` as simulated process `proc`."""
    proc.activate()
    try:
        return ferry.Client.connect(addr, timeout=WAIT, **opts)
    finally:
        deactivate()
