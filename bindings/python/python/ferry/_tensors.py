"""Tensors in and out of handlers and pipes: zero-copy views, one copy at most.

Received tensors are `_native.TensorRef`s: their bytes are exposed read-only through
`__array_interface__`, so `np.asarray` views them without a copy and keeps the
`TensorRef` (and with it the Rust lease on the peer's memory) as the array's base.

Result tensors go out as `_native.OutTensor`s, allocated in the connection's memory.
An array that *is* one (made by `ctx.alloc` / `ferry.empty`) goes as it is; any other
array is copied into a fresh one, once.

Device (CUDA) tensors never go through the host: they travel as `_native.DeviceTensor`s
over the cuda-ipc channel. A received one is handed out as it is (it has
`__cuda_array_interface__` and `__dlpack__`), or as a torch CUDA tensor over it. One sent
is the `DeviceTensor` itself (received, or from `alloc_device`: no copy), or another
library's memory (a CUDA torch tensor, anything with `__cuda_array_interface__`) that the
channel copies once into its pool, on the device.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, MutableMapping
from typing import Any

import numpy as np

from . import _native
from .errors import DeviceTensorError, ParamsError
from .tensors import BF16, F8E4M3FN, F8E5M2, ferry_dtype

Alloc = Callable[[list[int], str], _native.OutTensor]
"""Allocates an `OutTensor` of a shape and ferry dtype."""

try:  # bf16 as a real numpy dtype when ml_dtypes is installed (ferry[bf16]).
    import ml_dtypes

    _ML_BF16: np.dtype[Any] | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _ML_BF16 = None
_BF16_NUMPY: np.dtype[Any] = BF16 if _ML_BF16 is None else _ML_BF16

_NUMPY_VIEW: dict[str, np.dtype[Any]] = {
    "bf16": _BF16_NUMPY,
    "f8e4m3fn": F8E4M3FN,
    "f8e5m2": F8E5M2,
}
"""The numpy dtype of the ferry dtypes whose bytes the native module hands over as unsigned
integers (numpy lacks them): ml_dtypes' types (bf16: raw bits without ml_dtypes)."""

_TORCH_BITS: dict[str, tuple[Any, str]] = {
    "bf16": (np.int16, "bfloat16"),
    "f8e4m3fn": (np.uint8, "float8_e4m3fn"),
    "f8e5m2": (np.uint8, "float8_e5m2"),
}
"""For the dtypes torch.from_numpy / from_dlpack cannot take: the integer type their bits
go through and the torch dtype viewed from it (complex needs no help)."""

_BY_TORCH_NAME: dict[str, str] = {
    "bfloat16": "bf16",
    "float8_e4m3fn": "f8e4m3fn",
    "float8_e5m2": "f8e5m2",
}
"""ferry dtypes by the name of a torch dtype (or ml_dtypes type) numpy has no name for."""


def torch_view(a: np.ndarray[Any, Any], dtype: str, from_array: Callable[[Any], Any]) -> Any:
    """A torch tensor over `a`'s memory (`from_array`: `torch.from_numpy` or
    `from_dlpack`) with the torch dtype of the ferry dtype `dtype`."""
    bits = _TORCH_BITS.get(dtype)
    if bits is None:
        return from_array(a)
    import torch

    return from_array(a.view(bits[0])).view(getattr(torch, bits[1]))


def _torch() -> Any:
    """torch if it is imported already (a handler that uses tensors of it did)."""
    return sys.modules.get("torch")


def is_tensor_like(x: object) -> bool:
    """Whether `x` travels as a tensor: numpy arrays, torch tensors, CuPy arrays,
    anything with `__dlpack__`, `__array_interface__` or `__cuda_array_interface__`."""
    return (
        isinstance(x, (np.ndarray, _native.DeviceTensor))
        or hasattr(x, "__dlpack__")
        or hasattr(x, "__array_interface__")
        or hasattr(x, "__cuda_array_interface__")
    )


def to_numpy(ref: _native.TensorRef | _native.DeviceTensor) -> Any:
    """A read-only numpy view of a received tensor (bf16 as ml_dtypes' bfloat16 when
    installed, else `ferry.BF16` raw bits; float8 as ml_dtypes' float8 types); a device
    tensor stays the `DeviceTensor` it is (numpy has no device arrays)."""
    if isinstance(ref, _native.DeviceTensor):
        return ref
    a: np.ndarray[Any, Any] = ref._numpy()  # np.asarray(ref), through numpy's C API
    view = _NUMPY_VIEW.get(ref.dtype)
    if view is not None:
        a = a.view(view)
    return a


def to_torch(ref: _native.TensorRef | _native.DeviceTensor) -> Any:
    """A torch tensor over a received tensor's memory (no copy; bf16 as bfloat16, float8
    as torch's float8 dtypes).
    torch has no read-only tensors: a write into it (`x.mul_(2)`) copies the pages it
    touches into this process (the peer's memory is mapped copy-on-write), so the peer
    never sees it; such a tensor, returned, is sent as a copy.
    A device tensor becomes a torch CUDA tensor over the mapping (no copy; writes would
    reach the peer's memory: do not write) where torch can use CUDA, else it stays the
    `DeviceTensor` it is."""
    if isinstance(ref, _native.DeviceTensor):
        return device_torch(ref)
    from torch.utils.dlpack import from_dlpack

    ref._mark_writable()
    return torch_view(ref._numpy(), ref.dtype, from_dlpack)


def host_numpy(x: object) -> tuple[np.ndarray[Any, Any], str]:
    """`x` as a numpy array on the host (a view when it already is one) and its ferry
    dtype."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        name = _BY_TORCH_NAME.get(str(t.dtype).removeprefix("torch."))
        if name is not None:  # (no numpy type: their bits, as unsigned integers)
            if t.element_size() == 2:
                return t.view(torch.int16).numpy().view(np.uint16), name
            return t.view(torch.uint8).numpy(), name
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


def device_torch(ref: _native.DeviceTensor) -> Any:
    """A torch CUDA tensor over `ref` (zero-copy, through `__cuda_array_interface__`; the
    torch tensor holds `ref`, so the mapping lives as long as it), or `ref` itself where
    torch is not installed or cannot use CUDA."""
    try:
        import torch
    except ImportError:
        return ref
    if not torch.cuda.is_available():
        return ref
    t = torch.as_tensor(ref, device=f"cuda:{ref.device_index}")
    bits = _TORCH_BITS.get(ref.dtype)
    return t if bits is None else t.view(getattr(torch, bits[1]))


_KDL_CUDA = (2, 13)
"""DLPack device types of CUDA memory: device, managed."""


def is_device(x: object) -> bool:
    """Whether `x` is a CUDA tensor: a `DeviceTensor`, a CUDA torch tensor, anything with
    `__cuda_array_interface__` (CuPy, numba), or a DLPack exporter on a CUDA device."""
    if isinstance(x, (_native.DeviceTensor, np.ndarray)):
        return isinstance(x, _native.DeviceTensor)
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return bool(x.device.type == "cuda")
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None or hasattr(x, "__array_interface__"):
        return False
    try:
        return int(dev()[0]) in _KDL_CUDA
    except Exception:
        return False


def _device_index(x: object) -> int:
    """The CUDA device `x` is on: `__dlpack_device__`, else CuPy's `device.id`, else the
    device of `x.device` as torch names it; 0 when `x` says nothing (numba)."""
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None:
        return int(dev()[1])
    d = getattr(x, "device", None)
    for attr in ("id", "index"):
        n = getattr(d, attr, None)
        if isinstance(n, int):
            return n
    return 0


def device_parts(x: object) -> tuple[int, list[int], str, list[int] | None, int]:
    """`(address, shape, ferry dtype, strides in elements or None, device)` of device
    tensor `x`; `DeviceTensorError` for what ferry cannot send as it is (a dtype it does
    not have, a mask, strides that are not whole elements, a big-endian dtype)."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach()
        name = str(t.dtype).removeprefix("torch.")
        dtype = _BY_TORCH_NAME.get(name)
        if dtype is None:
            try:
                dtype = ferry_dtype(np.dtype(name))
            except (TypeError, ParamsError):
                raise DeviceTensorError(
                    f"a CUDA torch tensor of dtype {t.dtype}: ferry has no such dtype "
                    f"(it moves {', '.join(sorted(_NAMES))}); convert it first (.to(...))"
                ) from None
        strides: list[int] | None = None if t.is_contiguous() else [int(s) for s in t.stride()]
        index = t.device.index
        if index is None:
            index = torch.cuda.current_device()
        return int(t.data_ptr()), [int(n) for n in t.shape], dtype, strides, int(index)
    cai = getattr(x, "__cuda_array_interface__", None)
    if not isinstance(cai, dict):
        raise DeviceTensorError(
            f"{type(x).__qualname__} is on a CUDA device but has no __cuda_array_interface__: "
            "ferry takes CUDA torch tensors, CuPy and numba arrays, or anything with that "
            "interface (torch.from_dlpack(x) makes a torch tensor of a DLPack exporter)"
        )
    if cai.get("mask") is not None:
        raise DeviceTensorError("a masked CUDA array (__cuda_array_interface__ mask): unmask it")
    try:
        dt = np.dtype(cai["typestr"])
    except TypeError:
        raise DeviceTensorError(
            f"a CUDA array of typestr {cai['typestr']!r}: not a dtype ferry knows"
        ) from None
    if dt.byteorder == ">":
        raise DeviceTensorError(f"a big-endian CUDA array ({dt.str}): ferry moves little-endian")
    try:
        dtype = ferry_dtype(dt)
    except ParamsError as e:
        raise DeviceTensorError(f"a CUDA array: {e}") from None
    shape = [int(n) for n in cai["shape"]]
    strides = None
    given = cai.get("strides")
    if given is not None:
        if any(int(s) % dt.itemsize for s in given):
            raise DeviceTensorError(
                f"a CUDA array with strides {tuple(given)} (bytes) that are not whole "
                f"{dt.itemsize}-byte elements: make it contiguous first"
            )
        strides = [int(s) // dt.itemsize for s in given]
        if strides == _row_major(shape):
            strides = None
    return int(cai["data"][0]), shape, dtype, strides, _device_index(x)


def _row_major(shape: list[int]) -> list[int]:
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * max(shape[i + 1], 1)
    return out


Devices = MutableMapping[int, _native.DeviceTensor]
"""The device tensors a pipe, client or call allocated (`alloc_device`), by address, while
they live (a `weakref.WeakValueDictionary`)."""


def new_devices() -> Devices:
    """An empty `Devices`."""
    return weakref.WeakValueDictionary()


def remember(devices: Devices, t: _native.DeviceTensor) -> _native.DeviceTensor:
    """`t`, noted in `devices`."""
    devices[t.data_ptr] = t
    return t


def device_out(
    x: object, devices: Devices | None, given: Given | None = None
) -> _native.DeviceTensor:
    """What sends device tensor `x`: itself when it is a `DeviceTensor`, the one of
    `devices` (from `alloc_device`, or received) or of `given` (a call's params) it views
    whole (a torch or CuPy view of one: no copy; a received one goes back to its owner as
    a reference to its own memory), else `x` wrapped (the channel copies it once, on the
    device)."""
    if isinstance(x, _native.DeviceTensor):
        return x
    ptr, shape, dtype, strides, index = device_parts(x)
    d = None if devices is None or strides is not None else devices.get(ptr)
    if d is None and given and strides is None:
        d = next(
            (r for _, r in given if isinstance(r, _native.DeviceTensor) and r.data_ptr == ptr),
            None,
        )
    if (
        d is not None
        and d.dtype == dtype
        and list(d.shape) == shape
        and d.device_index == index
        and d.strides is None
    ):
        return d
    return _native.DeviceTensor.wrap(x, ptr, shape, dtype, index, strides)


def _data_ptr(a: np.ndarray[Any, Any]) -> int:
    ptr: int = a.__array_interface__["data"][0]
    return ptr


Out = _native.OutTensor | _native.TensorRef | _native.DeviceTensor
"""What goes out: an allocated tensor, a received one sent back as it is, or a device
tensor."""

Received = _native.TensorRef | _native.DeviceTensor
"""A received tensor as the native module hands it over: host or device."""

Given = list[tuple[Any, Received]]
"""The read-only numpy arrays a call's handler was given for received tensors, each
with its tensor."""


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


def to_out(
    x: object,
    alloc: Alloc,
    allocated: list[_native.OutTensor],
    given: Given | None = None,
    devices: Devices | None = None,
) -> Out:
    """What sends `x`: the received tensor when `x` is one of the arrays `given` for one
    (the same object, still read-only) or a read-only numpy view of exactly one, one of
    `allocated` when `x` is exactly it (no copy either way), else a new `OutTensor` with
    `x`'s bytes copied in. A device tensor goes as `device_out` says (never through the
    host)."""
    if is_device(x):
        return device_out(x, devices, given)
    if given and isinstance(x, np.ndarray) and not x.flags.writeable:
        for g, got in given:
            if g is x:  # an echo: the array the handler got, untouched (read-only)
                return got
    a, dtype = host_numpy(x)
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
    return copied(a, dtype, alloc)


def copied(a: np.ndarray[Any, Any], dtype: str, alloc: Alloc) -> _native.OutTensor:
    """A new `OutTensor` from `alloc` holding a copy of `a` (of ferry dtype `dtype`, as
    `host_numpy` gives them)."""
    out = alloc([int(n) for n in a.shape], dtype)
    view: np.ndarray[Any, Any] = np.asarray(out)
    if view.dtype != a.dtype:
        view = view.view(a.dtype)
    np.copyto(view, a, casting="no")
    return out


def out_array(out: _native.OutTensor) -> np.ndarray[Any, Any]:
    """A writable numpy view of an `OutTensor` (bf16 as bfloat16 or raw bits, float8 as
    ml_dtypes' float8 types)."""
    a: np.ndarray[Any, Any] = np.asarray(out)
    view = _NUMPY_VIEW.get(out.dtype)
    if view is not None:
        a = a.view(view)
    return a


def dtype_name(dtype: object) -> str:
    """A ferry dtype name from a name (`"f32"`, `"float32"`, `"float8_e4m3fn"`), a numpy
    dtype or type (ml_dtypes' included), or a torch dtype."""
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
        return _BY_TORCH_NAME.get(name) or ferry_dtype(np.dtype(name))
    if isinstance(dtype, str):
        if dtype in _NAMES:
            return dtype
        if dtype in _BY_TORCH_NAME:
            return _BY_TORCH_NAME[dtype]
    d = np.dtype(dtype)  # type: ignore[call-overload]
    if d.name == "bfloat16":  # ml_dtypes' (`BF16`-tagged uint16: ferry_dtype)
        return "bf16"
    return ferry_dtype(d)


_NAMES = {name for name, _, _ in _native.dtypes()}
