"""The conformance API (`ferry serve --api conformance`, `commands/src/conformance_api.rs`)
served from Python: the `python-server` column of `cargo xtask conformance` runs the
Rust RPC cases and the Python and TypeScript SDK scenarios against it.

    python -m ferry serve conformance_app:app unix:/tmp/conf.sock

Every method answers as the Rust one does: the same names, params, results, element
pattern, checksum, limits and errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Annotated, Any, Literal

import ml_dtypes
import numpy as np
from pydantic import Field
from typing_extensions import NotRequired, TypedDict

import ferry
from ferry.generated.conformance import DType
from ferry.tensors import NUMPY_DTYPES, ferry_dtype

app = ferry.App(
    "ferry conformance",
    description=(
        "The API every ferry SDK's conformance scenario runs against, served by the ferry"
        " Python package: tensors of every dtype, empty and large tensors, named maps, nested"
        " values, errors, slow calls and tasks."
    ),
)

Dim = Annotated[int, Field(ge=0, le=2**64 - 1)]
U32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
I64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]

MAX_MAKE_BYTES = 1 << 30
"""The largest tensor `make` and `make_map` build (bytes, per tensor)."""
MAX_MAP_ENTRIES = 4096
"""The most tensors `make_map` builds."""
MAX_SLOW_MS = 600_000
"""The longest `slow` sleeps (milliseconds)."""

INVALID_PARAMS = -32602
TENSOR_ERROR = -32006


def invalid(path: str, reason: str) -> ferry.RpcError:
    """The invalid-params error the Rust server gives (`ErrorObject::invalid_params`)."""
    return ferry.RpcError(
        INVALID_PARAMS, f"Invalid params: {path}: {reason}", {"path": path, "reason": reason}
    )


def pattern_into(out: np.ndarray[Any, Any], dtype: str) -> None:
    """Writes the pattern into `out` (a C-contiguous array of `dtype`'s item size)."""
    flat = out.reshape(-1).view(np.uint8 if dtype == "bool" else out.dtype)
    step = 1 << 20
    for lo in range(0, flat.size, step):
        i = np.arange(lo, min(lo + step, flat.size), dtype=np.uint64)
        r = i % np.uint64(251)
        if dtype == "bool":
            flat[lo : lo + i.size] = i % np.uint64(3) == 0
        elif dtype.startswith("u"):
            flat[lo : lo + i.size] = r
        elif dtype.startswith("i"):
            flat[lo : lo + i.size] = r.astype(np.int64) - 125
        else:
            v = (r.astype(np.float64) - 125.0) * 0.5
            if dtype == "bf16":  # exact in bf16: the top half of the f32
                bits = (v.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
                flat.view(np.uint16)[lo : lo + i.size] = bits
            elif dtype in ("f8e4m3fn", "f8e5m2"):  # rounded to nearest, ties to even
                f8 = ml_dtypes.float8_e4m3fn if dtype == "f8e4m3fn" else ml_dtypes.float8_e5m2
                flat.view(np.uint8)[lo : lo + i.size] = v.astype(f8).view(np.uint8)
            else:  # (complex: the real part, imaginary 0)
                flat[lo : lo + i.size] = v


def checksum(a: np.ndarray[Any, Any]) -> str:
    """sum(b_j * (j % 251 + 1)) mod 2**64 over the bytes (row-major), as a decimal string."""
    b = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    total = np.uint64(0)
    step = 1 << 20
    with np.errstate(over="ignore"):
        for lo in range(0, b.size, step):
            chunk = b[lo : lo + step].astype(np.uint64)
            w = np.arange(lo, lo + chunk.size, dtype=np.uint64) % np.uint64(251) + np.uint64(1)
            total = np.uint64(total + np.sum(chunk * w, dtype=np.uint64))
    return str(int(total))


def dtype_of(a: np.ndarray[Any, Any]) -> str:
    """The ferry dtype name of a received array (bf16 is ml_dtypes' bfloat16, or
    `ferry.BF16`'s tagged uint16 raw bits)."""
    if a.dtype.name == "bfloat16":
        return "bf16"
    return ferry_dtype(a.dtype)


class TensorInfo(TypedDict):
    """What the server saw of a tensor."""

    dtype: DType
    shape: list[int]
    strides: list[int] | None
    nbytes: int
    checksum: str


def info(a: np.ndarray[Any, Any]) -> TensorInfo:
    strides = None
    if not a.flags.c_contiguous and a.itemsize:
        strides = [s // a.itemsize for s in a.strides]
    return {
        "dtype": dtype_of(a),  # type: ignore[typeddict-item]
        "shape": list(a.shape),
        "strides": strides,
        "nbytes": a.nbytes,
        "checksum": checksum(a),
    }


def _make(ctx: ferry.Context, dtype: str, shape: list[int], path: str = "shape") -> Any:
    n = 1
    for d in shape:
        n *= d
    nbytes = n * NUMPY_DTYPES[dtype].itemsize
    if nbytes > MAX_MAKE_BYTES:
        raise invalid(path, f"{nbytes} bytes is over the limit of {MAX_MAKE_BYTES}")
    out = ctx.alloc(shape, dtype)
    pattern_into(np.asarray(out), dtype)
    return out


@app.function(summary="A tensor of the pattern")
def make(dtype: DType, shape: list[Dim], ctx: ferry.Context) -> np.ndarray:
    """Element i (row-major) is: bool: i % 3 == 0; unsigned ints: i % 251; signed ints:
    i % 251 - 125; floats (f16, bf16, f32, f64): (i % 251 - 125) * 0.5 (exact in every
    float type); float8 (f8e4m3fn, f8e5m2): that value rounded to nearest, ties to even;
    complex (c64, c128): that value as the real part, imaginary part 0."""
    result: np.ndarray = _make(ctx, dtype, shape)
    return result


@app.function(summary="The tensor of make, in the server's CUDA memory (a cuda-ipc pipe only)")
def make_cuda(dtype: DType, shape: list[Dim], device: U32 = 0) -> np.ndarray:
    """This server sends CUDA tensors from host memory only; it answers as a Rust server
    built without the cuda-ipc feature does."""
    raise ferry.RpcError(
        TENSOR_ERROR, "Tensor error: this server was built without the cuda-ipc feature"
    )


@app.function(summary="Returns the tensor")
def echo(tensor: np.ndarray) -> np.ndarray:
    return tensor


@app.function(summary="What the server received")
def inspect(tensor: np.ndarray) -> TensorInfo:
    """checksum: the sum over the tensor's bytes b_j (row-major, little-endian elements) of
    b_j * (j % 251 + 1), modulo 2^64, as a decimal string."""
    return info(tensor)


@app.function(summary="A named tensor map, one pattern tensor per name")
def make_map(
    names: list[str], dtype: DType, shape: list[Dim], ctx: ferry.Context
) -> dict[str, np.ndarray]:
    if len(names) > MAX_MAP_ENTRIES:
        raise invalid("names", f"at most {MAX_MAP_ENTRIES} names")
    return {name: _make(ctx, dtype, shape) for name in names}


@app.function(summary="Returns the map")
def echo_map(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return tensors


@app.function(summary="What the server received, per name")
def inspect_map(tensors: dict[str, np.ndarray]) -> dict[str, TensorInfo]:
    return {name: info(t) for name, t in tensors.items()}


@dataclasses.dataclass
class Nested:
    """Tensors inside lists, maps and objects."""

    name: str
    list: list[ferry.NDArray]
    map: dict[str, ferry.NDArray]
    maybe: ferry.NDArray | None = None


@app.function(summary="Returns the nested value")
def echo_nested(value: Nested) -> Nested:
    return value


class Point(TypedDict):
    """A point."""

    x: float
    y: float
    label: NotRequired[str]


class Shapes(TypedDict):
    """Every kind of JSON type a generator must handle."""

    points: list[Point]
    color: Literal["red", "green", "blue"]
    counts: dict[str, U32]
    pair: tuple[I64, str]
    flag: bool
    big: I64
    child: NotRequired[Shapes | None]


@app.function(summary="Returns the value")
def roundtrip(value: Shapes) -> Shapes:
    return value


@app.function(summary="Always fails with the error given")
def fail(code: I64, message: str, data: Any = None) -> None:
    raise ferry.RpcError(code, message, data)


@app.function(summary="Sleeps ms milliseconds (cancellable)")
async def slow(ms: Annotated[int, Field(ge=0)]) -> int:
    if ms > MAX_SLOW_MS:
        raise invalid("ms", f"at most {MAX_SLOW_MS}")
    await asyncio.sleep(ms / 1000)
    return ms


class Caller(TypedDict):
    """How the caller is connected."""

    kind: str
    channel: str
    server_pid: int


@app.function(summary="How the caller is connected")
def whoami(ctx: ferry.Context) -> Caller:
    p = ctx.peer
    return {"kind": p["kind"], "channel": p["channel"], "server_pid": os.getpid()}
