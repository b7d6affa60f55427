"""Tensors in and out of handlers and pipes: zero-copy views, one copy at most.

Received tensors are `_native.TensorRef`s: their bytes are exposed read-only through
`__array_interface__`, so `np.asarray` views them without a copy and keeps the
`TensorRef` (and with it the Rust lease on the peer's memory) as the array's base.

Result tensors go out as `_native.OutTensor`s, allocated in the connection's memory.
An array that *is* one (made by `ctx.alloc` / `ferry.empty`) goes as it is; any other
array is copied into a fresh one, once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from ferry_client.tensors import BF16, ferry_dtype

from . import _native

Alloc = Callable[[list[int], str], _native.OutTensor]
"""Allocates an `OutTensor` of a shape and ferry dtype."""

try:  # bf16 as a real numpy dtype when ml_dtypes is installed (ferry[bf16]).
    import ml_dtypes

    _ML_BF16: np.dtype[Any] | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _ML_BF16 = None
_BF16_NUMPY: np.dtype[Any] = BF16 if _ML_BF16 is None else _ML_BF16


def _torch() -> Any:
    """torch if it is imported already (a handler that uses tensors of it did)."""
    return sys.modules.get("torch")


def is_tensor_like(x: object) -> bool:
    """Whether `x` travels as a tensor: numpy arrays, torch tensors, CuPy arrays,
    anything with `__dlpack__`, `__array_interface__` or `__cuda_array_interface__`."""
    return (
        isinstance(x, np.ndarray)
        or hasattr(x, "__dlpack__")
        or hasattr(x, "__array_interface__")
        or hasattr(x, "__cuda_array_interface__")
    )


def to_numpy(ref: _native.TensorRef) -> np.ndarray[Any, Any]:
    """A read-only numpy view of a received tensor (bf16 as ml_dtypes' bfloat16 when
    installed, else `ferry_client.BF16` raw bits)."""
    a: np.ndarray[Any, Any] = np.asarray(ref)
    if ref.dtype == "bf16":
        a = a.view(_BF16_NUMPY)
    return a


def to_torch(ref: _native.TensorRef) -> Any:
    """A torch tensor over a received tensor's memory (no copy; bf16 as bfloat16).
    torch has no read-only tensors: a write into it (`x.mul_(2)`) copies the pages it
    touches into this process (the peer's memory is mapped copy-on-write), so the peer
    never sees it; such a tensor, returned, is sent as a copy."""
    import torch
    from torch.utils.dlpack import from_dlpack

    ref._mark_writable()
    a = np.asarray(ref)
    if ref.dtype == "bf16":
        return from_dlpack(a.view(np.int16)).view(torch.bfloat16)
    return from_dlpack(a)


def _host_numpy(x: object) -> tuple[np.ndarray[Any, Any], str]:
    """`x` as a numpy array on the host (a view when it already is one) and its ferry
    dtype."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), "bf16"
        a = t.numpy()
        return a, ferry_dtype(a.dtype)
    if hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):
        x = x.get()  # CuPy: to the host
    if isinstance(x, np.ndarray):
        a = x
    elif hasattr(x, "__array_interface__") or not hasattr(x, "__dlpack__"):
        a = np.asarray(x)
    else:
        a = np.from_dlpack(x)
    if _ML_BF16 is not None and a.dtype == _ML_BF16:  # (`BF16`-tagged uint16: ferry_dtype)
        return a.view(np.uint16), "bf16"
    return a, ferry_dtype(a.dtype)


def _data_ptr(a: np.ndarray[Any, Any]) -> int:
    ptr: int = a.__array_interface__["data"][0]
    return ptr


Out = _native.OutTensor | _native.TensorRef
"""What goes out: an allocated tensor, or a received one sent back as it is."""


def _received(a: np.ndarray[Any, Any]) -> _native.TensorRef | None:
    """The received tensor `a` views whole, if it does (an echo)."""
    base: object = a.base
    for _ in range(8):
        if isinstance(base, _native.TensorRef):
            return base
        base = getattr(base, "base", None)
        if base is None:
            return None
    return None


def to_out(x: object, alloc: Alloc, allocated: list[_native.OutTensor]) -> Out:
    """What sends `x`: one of `allocated` when `x` is exactly it, the received tensor
    when `x` is a read-only numpy view of exactly one (no copy either way), else a new
    `OutTensor` with `x`'s bytes copied in."""
    a, dtype = _host_numpy(x)
    if a.flags.c_contiguous:
        ptr: int | None = None

        def whole(t: Out) -> bool:  # `a` is exactly `t` (not a part, nor another type)
            nonlocal ptr
            if t.nbytes != a.nbytes or t.dtype != dtype or tuple(t.shape) != a.shape:
                return False
            if ptr is None:
                ptr = _data_ptr(a)
            return t.data_ptr == ptr

        for o in allocated:
            if whole(o):
                return o
        # Only a read-only numpy view of a received tensor goes back as it is: a torch
        # tensor over one may have been written (torch has no read-only tensors; the write
        # went to this process's private copy of the pages, not to the peer's memory).
        r = _received(a) if isinstance(x, np.ndarray) and not x.flags.writeable else None
        if r is not None and whole(r):
            return r
    out = alloc([int(n) for n in a.shape], dtype)
    view: np.ndarray[Any, Any] = np.asarray(out)
    if view.dtype != a.dtype:
        view = view.view(a.dtype)
    np.copyto(view, a, casting="no")
    return out


def out_array(out: _native.OutTensor) -> np.ndarray[Any, Any]:
    """A writable numpy view of an `OutTensor` (bf16 as bfloat16 or raw bits)."""
    a: np.ndarray[Any, Any] = np.asarray(out)
    if out.dtype == "bf16":
        a = a.view(_BF16_NUMPY)
    return a


def dtype_name(dtype: object) -> str:
    """A ferry dtype name from a name (`"f32"`, `"float32"`), a numpy dtype or type, or a
    torch dtype."""
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype == torch.bfloat16:
            return "bf16"
        return ferry_dtype(np.dtype(str(dtype).removeprefix("torch.")))
    if isinstance(dtype, str) and dtype in _NAMES:
        return dtype
    d = np.dtype(dtype)  # type: ignore[call-overload]
    if d.name == "bfloat16":  # ml_dtypes' (`BF16`-tagged uint16: ferry_dtype)
        return "bf16"
    return ferry_dtype(d)


_NAMES = {name for name, _, _ in _native.dtypes()}
