"""The checkpoint dtypes (float8 e4m3fn and e5m2, complex64 and complex128): their numpy
names both ways, and round trips through real `ferry serve` and `ferry serve-weights`
processes (a float8 safetensors checkpoint written by hand: safetensors' numpy API has no
float8)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

import ferry
from ferry import (
    F8E4M3FN,
    F8E5M2,
    Client,
    ParamsError,
    RpcError,
    Tensor,
    open_weights,
)
from ferry.tensors import ferry_dtype, numpy_dtype
from tests.client.servers import Server, unique_addr

NEW = {
    "f8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "c64": np.dtype(np.complex64),
    "c128": np.dtype(np.complex128),
}


def sample(name: str, n: int) -> npt.NDArray[Any]:
    """`n` elements of dtype `name`: every float8 bit pattern (NaNs and, for e5m2,
    infinities included), or complex numbers with NaN, infinities and negative zero."""
    if name.startswith("f8"):
        return (np.arange(n, dtype=np.int64) % 256).astype(np.uint8).view(NEW[name])
    rng = np.random.default_rng(n)
    re = rng.standard_normal(n)
    im = rng.standard_normal(n)
    special = [np.nan, np.inf, -np.inf, -0.0]
    re[: min(n, 4)] = special[: min(n, 4)]
    out: npt.NDArray[Any] = (re + 1j * im).astype(NEW[name])
    return out


def same_bits(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_numpy_names_both_ways() -> None:
    assert list(NEW) == list(ferry.DTYPES[-4:])  # (last, as in PROTOCOL.md §5.1)
    for name, dt in NEW.items():
        assert numpy_dtype(name) == dt and ferry_dtype(dt) == name
        assert numpy_dtype(name).itemsize == {"f8": 1, "c6": 8, "c1": 16}[name[:2]]
    assert NEW["f8e4m3fn"] == F8E4M3FN and NEW["f8e5m2"] == F8E5M2
    assert ferry_dtype(np.dtype(">c8")) == "c64"  # (sent little-endian)
    assert ferry_dtype(np.dtype(ml_dtypes.bfloat16)) == "bf16"
    # ml_dtypes' other 8-bit floats are other formats, not ferry's.
    for other in (ml_dtypes.float8_e4m3, ml_dtypes.float8_e4m3fnuz, ml_dtypes.int4):
        with pytest.raises(ParamsError):
            ferry_dtype(np.dtype(other))


def test_tensor_takes_raw_bits_and_refuses_other_formats() -> None:
    t = Tensor(np.array([0x38, 0xC0, 0x7E], np.uint8), "f8e4m3fn")
    assert t.array.dtype == F8E4M3FN
    assert t.array.astype(np.float32).tolist() == [1.0, -2.0, 448.0]
    t = Tensor(np.array([0x3C, 0x7C], np.uint8), "f8e5m2")
    assert t.array.astype(np.float32).tolist() == [1.0, np.inf]
    assert Tensor(np.zeros(2, np.complex64)).dtype == "c64"
    assert Tensor(np.zeros(2, ml_dtypes.bfloat16)).dtype == "bf16"
    for arr, name in [
        (np.zeros(2, F8E5M2), "f8e4m3fn"),
        (np.zeros(2, F8E4M3FN), "f8e5m2"),
        (np.zeros(2, ml_dtypes.float8_e4m3), "f8e4m3fn"),
        (np.zeros(2, np.int8), "f8e5m2"),
        (np.zeros(2, np.complex64), "f64"),
        (np.zeros(2, np.float64), "c64"),
        (np.zeros(2, np.uint16), "c64"),
    ]:
        with pytest.raises(ParamsError):
            Tensor(arr, name)


def test_dlpack_exports_float8_as_raw_bits() -> None:
    a = np.array([1.5, -2.0], F8E4M3FN)
    got = np.from_dlpack(Tensor(a))
    assert got.dtype == np.uint8 and got.tolist() == [0x3C, 0xC0]
    c = np.array([1 + 2j], np.complex128)
    assert np.from_dlpack(Tensor(c)).tolist() == [1 + 2j]


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "inline"])
def test_every_new_dtype_round_trips_through_a_server(demo: Server, shm: bool) -> None:
    with Client.connect(demo.addr, shm=shm) as c:
        assert c.channel == ("shm" if shm else "inline")
        for name, dt in NEW.items():
            for n in (5, 70_000):  # inline-sized, and shm-sized
                a = sample(name, n).reshape(-1, 5)
                back = c.call("echo", {"tensor": a})
                assert same_bits(back, a), (name, n)
                assert ferry_dtype(back.dtype) == name
                # Strided (a transposed view) and a `Tensor` of raw bits.
                assert same_bits(c.call("echo", {"tensor": a.T}), a.T), name
                if name.startswith("f8"):
                    bits = a.view(np.uint8)
                    back = c.call("echo", {"tensor": Tensor(bits, name)})
                    assert same_bits(back, a), name
            # An array allocated in shared memory goes without a copy, as any other.
            x = c.alloc([4, 3], name)
            assert x.dtype == dt
            x[...] = sample(name, 12).reshape(4, 3)
            assert same_bits(c.call("echo", {"tensor": x}), x), name


def test_server_made_values(demo: Server) -> None:
    with Client.connect(demo.addr) as c:
        # 17 is a tie in e4m3fn (16 or 18): even, 16; e5m2 has 16 exactly.
        for name, fill, want in [
            ("f8e4m3fn", 17.0, 16.0),
            ("f8e5m2", 17.0, 16.0),
            ("f8e4m3fn", 1000.0, np.nan),  # past 448: NaN (no infinity)
            ("f8e5m2", 1e6, np.inf),
        ]:
            t = c.call("create_tensor", {"shape": [3], "dtype": name, "fill": fill})
            assert t.dtype == NEW[name], name
            assert np.array_equal(t.astype(np.float64), np.full(3, want), equal_nan=True), (name, t)
            # ml_dtypes rounds as the server does.
            assert t.tobytes() == np.full(3, fill).astype(NEW[name]).tobytes()
            if np.isfinite(want):
                assert c.call("sum", {"tensor": t}) == 3 * want  # goes back as float8
        for name in ("c64", "c128"):
            t = c.call("create_tensor", {"shape": [2, 2], "dtype": name, "fill": 2.5})
            assert t.dtype == NEW[name] and t.tolist() == [[2.5 + 0j] * 2] * 2
            with pytest.raises(RpcError) as e:
                c.call("sum", {"tensor": t})  # a complex sum is no f64
            assert e.value.code == -32602 and "complex" in e.value.message


def safetensors_file(path: Path, tensors: dict[str, npt.NDArray[Any]]) -> None:
    """Writes a safetensors file by hand (8-byte header length, JSON header, data)."""
    names = {"f8e4m3fn": "F8_E4M3", "f8e5m2": "F8_E5M2", "c64": "C64", "f32": "F32"}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    data = b""
    for k, v in tensors.items():
        raw = np.ascontiguousarray(v).tobytes()
        header[k] = {
            "dtype": names[ferry_dtype(v.dtype)],
            "shape": list(v.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.fixture
def fp8_checkpoint(
    tmp_path: Path,
) -> Iterator[tuple[Server, dict[str, npt.NDArray[Any]]]]:
    rng = np.random.default_rng(3)
    sd: dict[str, npt.NDArray[Any]] = {
        "layers.0.weight": (rng.standard_normal((64, 32)) * 8).astype(F8E4M3FN),
        "layers.0.weight_scale": np.array([0.125], np.float32),
        "layers.1.weight": (rng.standard_normal((16, 16)) * 8).astype(F8E5M2),
        "rotary": (rng.standard_normal(8) + 1j * rng.standard_normal(8)).astype(np.complex64),
    }
    path = tmp_path / "fp8.safetensors"
    safetensors_file(path, sd)
    s = Server(
        "weights",
        unique_addr("fp8"),
        ["serve-weights", str(path), "--name", "fp8", "--addr"],
    )
    try:
        yield s, sd
    finally:
        s.kill()


def test_a_float8_checkpoint_through_serve_weights(
    fp8_checkpoint: tuple[Server, dict[str, npt.NDArray[Any]]],
) -> None:
    server, sd = fp8_checkpoint
    b = open_weights(server.addr, "fp8")
    assert sorted(b) == sorted(sd)
    for k, v in sd.items():
        assert same_bits(b[k], v), k
    assert not b["layers.0.weight"].flags.writeable  # a view of the server's bucket
    f32 = b["layers.0.weight"].astype(np.float32)
    assert np.array_equal(f32, sd["layers.0.weight"].astype(np.float32))


def test_a_float8_checkpoint_as_torch(
    fp8_checkpoint: tuple[Server, dict[str, npt.NDArray[Any]]],
) -> None:
    torch = pytest.importorskip("torch")
    server, sd = fp8_checkpoint
    b = open_weights(server.addr, "fp8", as_torch=True)
    want = {
        "layers.0.weight": torch.float8_e4m3fn,
        "layers.0.weight_scale": torch.float32,
        "layers.1.weight": torch.float8_e5m2,
        "rotary": torch.complex64,
    }
    for k, v in sd.items():
        t = b[k]
        assert t.dtype == want[k] and tuple(t.shape) == v.shape, k
        assert t.view(torch.uint8).numpy().tobytes() == v.tobytes(), k
    w = b["layers.0.weight"].to(torch.float32).numpy()
    assert np.array_equal(w, sd["layers.0.weight"].astype(np.float32))
