"""Tensors as numpy arrays: dtypes, bfloat16, float8, and a DLPack-exporting wrapper.

- Every ferry dtype maps to a numpy dtype (`NUMPY_DTYPES`), little-endian. `bf16` has no
  numpy type: a bf16 tensor is a `uint16` array of the raw bits whose dtype is `BF16`,
  a `uint16` dtype carrying `metadata={"ferry_dtype": "bf16"}` (views and slices keep it,
  so such an array goes back to the server as bf16). Convert with `bf16_to_f32` and
  `f32_to_bf16`, or mark any `uint16` array as bf16 with `Tensor(array, "bf16")`.
  An `ml_dtypes.bfloat16` array is sent as bf16 too.
- `f8e4m3fn` and `f8e5m2` arrive as arrays of ml_dtypes' `float8_e4m3fn` and
  `float8_e5m2` (`F8E4M3FN`, `F8E5M2`): real float types (`astype(np.float32)` converts),
  and such arrays go out as those dtypes. `Tensor(bits, "f8e4m3fn")` sends any `uint8`
  array of raw bits as float8. `c64` and `c128` are numpy's `complex64` and `complex128`.
- `Tensor` wraps an array with an explicit ferry dtype and implements the DLPack protocol
  (`__dlpack__`, `__dlpack_device__`), so `torch.from_dlpack(Tensor(a))` and
  `np.from_dlpack(...)` work without a copy, read-only arrays included (DLPack 1.0
  signals read-only memory); a consumer that only speaks the old unversioned protocol
  gets a copy of a read-only array, never a writable view of shared memory.
- Received arrays are plain `numpy.ndarray`s; those viewing shared memory are read-only.
"""

from __future__ import annotations

from typing import Any, Union

import ml_dtypes
import numpy as np
import numpy.typing as npt

from . import _constants
from .errors import ParamsError
from .refs import TensorRef

BF16 = np.dtype(np.uint16, metadata={"ferry_dtype": "bf16"})
"""The numpy dtype of bf16 arrays: `uint16` raw bits, tagged as bf16."""

F8E4M3FN: np.dtype[Any] = np.dtype(ml_dtypes.float8_e4m3fn)
"""The numpy dtype of f8e4m3fn arrays (ml_dtypes' `float8_e4m3fn`)."""

F8E5M2: np.dtype[Any] = np.dtype(ml_dtypes.float8_e5m2)
"""The numpy dtype of f8e5m2 arrays (ml_dtypes' `float8_e5m2`)."""

NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "bool": np.dtype(np.bool_),
    "u8": np.dtype("u1"),
    "i8": np.dtype("i1"),
    "u16": np.dtype("<u2"),
    "i16": np.dtype("<i2"),
    "u32": np.dtype("<u4"),
    "i32": np.dtype("<i4"),
    "u64": np.dtype("<u8"),
    "i64": np.dtype("<i8"),
    "f16": np.dtype("<f2"),
    "bf16": BF16,
    "f32": np.dtype("<f4"),
    "f64": np.dtype("<f8"),
    "f8e4m3fn": F8E4M3FN,
    "f8e5m2": F8E5M2,
    "c64": np.dtype("<c8"),
    "c128": np.dtype("<c16"),
}
"""The numpy dtype of each ferry dtype."""

DTYPES = _constants.DTYPES
"""Every ferry dtype name, in the protocol's order (generated from the Rust table;
`NUMPY_DTYPES` has each, in the same order: `test_vectors.py` checks)."""

_BY_NUMPY: dict[tuple[str, int], str] = {
    ("b", 1): "bool",
    ("u", 1): "u8",
    ("i", 1): "i8",
    ("u", 2): "u16",
    ("i", 2): "i16",
    ("u", 4): "u32",
    ("i", 4): "i32",
    ("u", 8): "u64",
    ("i", 8): "i64",
    ("f", 2): "f16",
    ("f", 4): "f32",
    ("f", 8): "f64",
    ("c", 8): "c64",
    ("c", 16): "c128",
}

_BY_TYPE: dict[type, str] = {
    ml_dtypes.bfloat16: "bf16",
    ml_dtypes.float8_e4m3fn: "f8e4m3fn",
    ml_dtypes.float8_e5m2: "f8e5m2",
}
"""ml_dtypes' types, by their scalar type (their `kind` says little: `V` or `f`)."""

RAW_BITS: frozenset[str] = frozenset({"bf16", "f8e4m3fn", "f8e5m2"})
"""Dtypes numpy itself lacks: an unsigned integer array of their size is taken as their
raw bits (`Tensor(bits, "bf16")`), and consumers that know only numpy's types (DLPack,
CuPy) get those bits."""


_FERRY_BY_ID: dict[int, tuple[np.dtype[Any], str]] = {}
"""`ferry_dtype`'s answers by the dtype's id (each entry holds its dtype, so the id
stays that dtype's): a dtype's attributes cost more to read than a dict lookup."""


def ferry_dtype(dtype: np.dtype[Any]) -> str:
    """The ferry dtype of a numpy dtype (`BF16`-tagged `uint16` is `bf16`)."""
    hit = _FERRY_BY_ID.get(id(dtype))
    if hit is not None and hit[0] is dtype:
        return hit[1]
    name = _ferry_dtype(dtype)
    if len(_FERRY_BY_ID) < 256:
        _FERRY_BY_ID[id(dtype)] = (dtype, name)
    return name


def _ferry_dtype(dtype: np.dtype[Any]) -> str:
    meta = dtype.metadata
    if meta is not None and meta.get("ferry_dtype") in NUMPY_DTYPES:
        return str(meta["ferry_dtype"])
    by_type = _BY_TYPE.get(dtype.type)
    if by_type is not None:
        return by_type
    name = _BY_NUMPY.get((dtype.kind, dtype.itemsize))
    if name is None or dtype.fields is not None or dtype.subdtype is not None:
        raise ParamsError(
            f"numpy dtype {dtype} has no ferry dtype (expected one of {DTYPES})"
        )
    return name


def storage_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The numpy dtype that holds `dtype`'s bytes for code that knows only numpy's own
    types (DLPack, CuPy, `__array_interface__`): the unsigned integer of its size for bf16
    and the float8s (tag dropped), `dtype` itself otherwise."""
    if dtype.metadata is not None or dtype.type in _BY_TYPE:
        return np.dtype(f"<u{dtype.itemsize}")
    return dtype


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype of the ferry dtype `name`."""
    try:
        return NUMPY_DTYPES[name]
    except KeyError:
        raise ParamsError(f"unknown dtype {name!r}: expected one of {DTYPES}") from None


def _ferry_dtype_or_none(dtype: np.dtype[Any]) -> str | None:
    try:
        return ferry_dtype(dtype)
    except ParamsError:
        return None


def bf16_to_f32(bits: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """bf16 raw bits (any `uint16` array, e.g. a received bf16 tensor) as float32 values."""
    a = np.asarray(bits)
    if a.dtype.kind != "u" or a.dtype.itemsize != 2:
        raise ParamsError(f"expected uint16 raw bits, got dtype {a.dtype}")
    return (a.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """float values rounded to bf16 (round to nearest, ties to even; NaN stays NaN), as an
    array of dtype `BF16`."""
    a = np.ascontiguousarray(values, dtype=np.float32)
    u = a.view(np.uint32)
    rounded = (u + (((u >> 16) & 1) + 0x7FFF)) >> 16
    out = np.where(np.isnan(a), np.uint32(0x7FC0), rounded).astype(np.uint16)
    return out.view(BF16)


def _dlpack_copy_ok(copy: bool | None) -> bool:
    return copy is not False


class Tensor:
    """A numpy array with an explicit ferry dtype, exporting DLPack.

    Use it to send a `uint16` array as bf16 (`Tensor(bits, "bf16")`) or a `uint8` one as
    float8 (`Tensor(bits, "f8e4m3fn")`), or to hand any array, read-only shared memory
    included, to a DLPack consumer (`torch.from_dlpack(Tensor(array))`; bf16 and float8,
    which numpy's DLPack export lacks, go as their raw bits).
    """

    __slots__ = ("array", "dtype")

    def __init__(self, array: npt.ArrayLike, dtype: str | None = None) -> None:
        arr = np.asarray(array)
        if dtype is None:
            dtype = ferry_dtype(arr.dtype)
        want = numpy_dtype(dtype)
        raw = dtype in RAW_BITS
        # (dtype equality ignores bf16's tag: a bf16 array may go as u16)
        if arr.dtype.itemsize != want.itemsize or not (
            arr.dtype == want
            or (raw and arr.dtype.kind == "u")
            or _ferry_dtype_or_none(arr.dtype) == dtype
        ):
            raise ParamsError(
                f"an array of dtype {arr.dtype} cannot be a {dtype} tensor"
            )
        if raw and (arr.dtype != want or arr.dtype.metadata != want.metadata):
            arr = arr.view(want)
        self.array: npt.NDArray[Any] = arr
        self.dtype: str = dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions."""
        return tuple(self.array.shape)

    def numpy(self) -> npt.NDArray[Any]:
        """The array (no copy)."""
        return self.array

    def __array__(
        self, dtype: Any = None, copy: bool | None = None
    ) -> npt.NDArray[Any]:
        if dtype is None and not copy:
            return self.array
        return np.array(self.array, dtype=dtype, copy=True)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """Exports the array: zero-copy (read-only memory flagged as such) to consumers of
        DLPack 1.0 and later; to an older consumer, a read-only array is exported as a
        copy, unless `copy=False`, which raises `BufferError`."""
        if stream is not None and stream != -1:
            raise BufferError("ferry tensors are CPU tensors: stream must be None")
        arr = self.array
        plain = storage_dtype(arr.dtype)
        if plain is not arr.dtype:
            arr = arr.view(plain)  # bf16, float8: their raw bits
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        if versioned:
            return arr.__dlpack__(
                max_version=max_version, dl_device=dl_device, copy=copy
            )
        if not arr.flags.writeable:
            if not _dlpack_copy_ok(copy):
                raise BufferError(
                    "a read-only array cannot be exported through the unversioned DLPack "
                    "protocol without a copy (ask for max_version=(1, 0))"
                )
            arr = arr.copy()
        return arr.__dlpack__()

    def __repr__(self) -> str:
        return f"Tensor({self.dtype}{list(self.array.shape)})"


TensorIn = Union[npt.NDArray[Any], Tensor]
"""What a tensor param accepts: a numpy array (its dtype decides the ferry dtype) or a
`Tensor`."""

TensorParam = Union[TensorIn, TensorRef]
"""What a method's tensor param accepts (generated clients type tensor params so): a
`TensorIn`, or a `TensorRef` to a tensor the server keeps, which the server puts in its place
(PROTOCOL.md section 21)."""


def typed_view(
    buf: npt.NDArray[np.uint8],
    dtype: np.dtype[Any],
    meta: dict[str, Any],
    span: int,
    strided: bool,
) -> npt.NDArray[Any]:
    """`buf` (bytes from a tensor's first element, already checked against `meta` with
    `byte_span`: `span` bytes, `strided` when `meta` has strides) as an array of `dtype`
    and `meta`'s shape: a reshaped view, or a strided one."""
    shape = tuple(meta["shape"])
    if strided:
        strides = tuple(s * dtype.itemsize for s in meta["strides"])
        out: npt.NDArray[Any] = np.lib.stride_tricks.as_strided(
            buf[:span].view(dtype), shape, strides
        )
        return out
    return buf.view(dtype).reshape(shape)
