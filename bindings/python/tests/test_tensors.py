"""Tensors through a served app over shared memory: received read-only without a copy,
results allocated in the connection's memory go back without one, other arrays are
copied; dtypes; tensors nested in params and results."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import ferry
from ferry.tensors import BF16
from tests.apps import mapping_of

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    ml_dtypes = None


def test_channel_is_shm(client: ferry.Client) -> None:
    assert client.channel == "shm"
    peer = client.call("peer")
    assert peer["pid"] == os.getpid()
    assert peer["uid"] == os.getuid()
    assert peer["channel"] == "shm"


@pytest.mark.parametrize("how", ["inline", "copied-to-shm", "client-alloc"])
def test_param_is_read_only_zero_copy_view(client: ferry.Client, how: str) -> None:
    """Small arrays travel in the frame, large ones through shared memory (copied there
    once by the client, or allocated there by it): the handler always gets a read-only
    view of the received bytes, no copy of its own."""
    shape = (3, 4) if how == "inline" else (64, 1024)  # 48 bytes / 256 KiB
    values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    if how == "client-alloc":
        x = client.alloc(shape, "f32")
        x[...] = values
    else:
        x = values.copy()
    r = client.call("inspect_array", [x])
    assert r["writeable"] is False
    assert r["wrote"] == "refused"
    assert r["chain"][0] == "numpy.ndarray"
    assert r["chain"][1:] == ["ferry._native.TensorRef"]
    assert r["dtype"] == "float32"
    assert r["shape"] == list(shape)
    assert r["sum"] == float(values.sum(dtype=np.float64))
    if how != "inline":
        # The handler's array is the caller's shared memory, mapped.
        assert r["mapping"].startswith("/memfd:"), r["mapping"]
    np.testing.assert_array_equal(x, values)  # the caller's array is as it was


@pytest.mark.parametrize("method", ["scale", "scale_ctx", "async_scale"])
def test_allocated_result(client: ferry.Client, method: str) -> None:
    x = np.linspace(-1, 1, 10, dtype=np.float64)
    r = client.call(method, {"x": x, "k": 3})
    assert isinstance(r, np.ndarray)
    assert r.dtype == np.float64
    np.testing.assert_array_equal(r, x * 3)
    assert not r.flags.writeable
    assert mapping_of(r).startswith("/memfd:")


def test_allocated_result_is_not_copied(client: ferry.Client, key: str) -> None:
    """An array from `ferry.empty` travels as it is: the caller views the server's
    memory, so a later change there shows in the caller's array."""
    r = client.call("kept_shared", [key, 5])
    np.testing.assert_array_equal(r, np.ones(5, np.float32))
    assert client.call("poke", [key, 7.0]) is True
    np.testing.assert_array_equal(r, np.full(5, 7.0, np.float32))


def test_other_result_is_copied(client: ferry.Client, key: str) -> None:
    r = client.call("kept_copied", [key, 5])
    np.testing.assert_array_equal(r, np.ones(5, np.float32))
    assert client.call("poke", [key, 7.0]) is True
    np.testing.assert_array_equal(r, np.ones(5, np.float32))


def data_ptr(a: np.ndarray) -> int:
    ptr: int = a.__array_interface__["data"][0]
    return ptr


@pytest.mark.parametrize("method", ["echo", "swap"])
def test_received_tensors_go_back_as_they_are(client: ferry.Client, method: str) -> None:
    """Received tensors returned by the handler are not copied: over shm the caller gets
    views of its own memory back, each where the handler put it."""
    x, y = client.alloc((3, 4), "f32"), client.alloc((3, 4), "f32")
    x[...], y[...] = 1.0, 2.0
    if method == "echo":
        got, want = [client.call("echo", [x])], [x]
    else:
        got, want = client.call("swap", [x, y]), [y, x]
    for g, w in zip(got, want, strict=True):
        assert data_ptr(g) == data_ptr(w)
        np.testing.assert_array_equal(g, w)


def test_alloc_viewed_as_another_dtype_keeps_that_dtype(client: ferry.Client) -> None:
    r = client.call("viewed_as_int")
    assert r.dtype == np.int32
    np.testing.assert_array_equal(r, np.ones(4, np.float32).view(np.int32))


def dtype_cases() -> list[Any]:
    rng = np.random.default_rng(7)
    cases = [
        ("f32", rng.standard_normal((4, 3)).astype(np.float32)),
        ("f64", rng.standard_normal(7)),
        ("i64", np.array([-(2**62), -1, 0, 1, 2**62], dtype=np.int64)),
        ("u8", np.arange(250, 256, dtype=np.uint8)),
        ("bool", np.array([[True, False], [False, True]])),
        ("f16", np.array([0.5, -2.0, 65504.0], dtype=np.float16)),
    ]
    return [pytest.param(a, id=name) for name, a in cases]


@pytest.mark.parametrize("x", dtype_cases())
@pytest.mark.parametrize("method", ["copy_of", "alloc_copy", "echo"])
def test_dtypes_round_trip(client: ferry.Client, x: np.ndarray, method: str) -> None:
    r = client.call(method, [x])
    assert r.dtype == x.dtype
    assert r.shape == x.shape
    np.testing.assert_array_equal(r, x)
    info = client.call("inspect_array", [x])
    assert info["dtype"] == str(x.dtype)
    assert info["writeable"] is False


def bf16_bits(values: list[float]) -> np.ndarray:
    """bf16 values as the client sends them: raw bits tagged `BF16`."""
    f = np.asarray(values, dtype=np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16).view(BF16)


@pytest.mark.parametrize("method", ["copy_of", "alloc_copy", "echo", "scale"])
def test_bf16(client: ferry.Client, method: str) -> None:
    x = bf16_bits([1.5, -2.0, 3.0, 0.0])
    r = client.call(method, [x])
    # ml_dtypes' bfloat16 where installed (ferry.Client), else raw bits tagged BF16.
    if ml_dtypes is not None:
        assert r.dtype == np.dtype(ml_dtypes.bfloat16)
    else:
        assert r.dtype == BF16
        assert r.dtype.metadata == {"ferry_dtype": "bf16"}
    want = bf16_bits([3.0, -4.0, 6.0, 0.0]) if method == "scale" else x
    np.testing.assert_array_equal(r.view(np.uint16), want.view(np.uint16))


def test_bf16_in_handler_is_ml_dtypes(client: ferry.Client) -> None:
    if ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed: the server sees bf16 as raw bits")
    info = client.call("inspect_array", [bf16_bits([1.5, -2.0, 3.0])])
    assert info["dtype"] == "bfloat16"
    assert info["sum"] == 2.5
    assert info["writeable"] is False


def test_shapes(client: ferry.Client) -> None:
    empty = np.zeros((0, 3), np.float32)
    r = client.call("copy_of", [empty])
    assert r.shape == (0, 3) and r.dtype == np.float32
    scalar = np.array(5.0)
    r = client.call("alloc_copy", [scalar])
    assert r.shape == () and r[()] == 5.0
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    r = client.call("transposed", [x])
    np.testing.assert_array_equal(r, x.T)
    assert r.shape == (3, 2)
    # A non-contiguous param.
    r = client.call("copy_of", [x[:, ::2]])
    np.testing.assert_array_equal(r, x[:, ::2])


def test_large_tensor(client: ferry.Client) -> None:
    x = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
    r = client.call("scale", [x, 0.5])
    assert r.shape == x.shape
    assert r[-1] == x[-1] * 0.5
    np.testing.assert_array_equal(r[:1000], x[:1000] * 0.5)


def test_tensors_nested_in_results(client: ferry.Client) -> None:
    x = np.arange(4, dtype=np.int64)
    r = client.call("bundle", [x])
    assert r["n"] == 4
    np.testing.assert_array_equal(r["twice"], x * 2)
    np.testing.assert_array_equal(r["parts"][0], x[:1])
    np.testing.assert_array_equal(r["parts"][1]["last"], x[-1:])

    xs = [np.ones(3, np.float32), np.full(3, 2, np.float32)]
    r = client.call("bundle_typed", [xs])
    assert r["sums"] == [3.0, 6.0]
    np.testing.assert_array_equal(r["stacked"], np.stack(xs))
    np.testing.assert_array_equal(r["first"], xs[0])


def test_tensor_list_and_map_params(client: ferry.Client) -> None:
    xs = [np.arange(3, dtype=np.float64), np.arange(2, dtype=np.float64)]
    r = client.call("tensor_list", {"xs": xs, "k": 2})
    assert len(r) == 2
    np.testing.assert_array_equal(r[0], xs[0] * 2)
    np.testing.assert_array_equal(r[1], xs[1] * 2)
    m = {"w": np.zeros((2, 2), np.float32), "b": np.ones(2, np.int64)}
    r = client.call("tensor_map", [m])
    assert set(r) == {"w", "b"}
    np.testing.assert_array_equal(r["w"], np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(r["b"], np.full(2, 2, np.int64))


def test_optional_tensors(client: ferry.Client) -> None:
    x = np.arange(3, dtype=np.float32)
    assert client.call("optional_tensors") is None
    assert client.call("optional_tensors", {"x": None, "y": None}) is None
    np.testing.assert_array_equal(client.call("optional_tensors", [x]), x)
    np.testing.assert_array_equal(client.call("optional_tensors", {"y": x}), x)
    np.testing.assert_array_equal(client.call("optional_tensors", [x, x * 2]), x * 3)


def test_model_with_tensor_field(client: ferry.Client) -> None:
    x = np.arange(3, dtype=np.float32)
    r = client.call("relabel", {"s": {"x": x, "label": "a"}, "suffix": "b"})
    assert r["label"] == "ab"
    np.testing.assert_array_equal(r["x"], x * 2)


def test_tensors_in_dataclass_and_typeddict(client: ferry.Client) -> None:
    px = np.arange(6, dtype=np.float32).reshape(2, 3)
    left, right = np.ones(3, np.float32), np.full(3, 2.0, np.float32)
    r = client.call(
        "brighten",
        {"frame": {"pixels": px, "gain": 2.0}, "pair": {"left": left, "right": right}},
    )
    assert r["gain"] == 4.0
    np.testing.assert_array_equal(r["pixels"], left + right + px.mean() * 2.0)
    # The dataclass's default applies; a missing tensor field is invalid params naming it.
    r = client.call("brighten", {"frame": {"pixels": px}, "pair": {"left": left, "right": right}})
    assert r["gain"] == 2.0
    with pytest.raises(ferry.RpcError) as e:
        client.call("brighten", {"frame": {"gain": 1.0}, "pair": {"left": left, "right": right}})
    assert e.value.code == -32602
    assert e.value.data["path"] == "frame.pixels"


def test_bad_tensor_params(client: ferry.Client) -> None:
    with pytest.raises(ferry.RpcError) as e:
        client.call("scale", {"x": [1, 2, 3]})
    assert e.value.code == -32602
    assert e.value.data["path"] == "x"
    assert "tensor" in e.value.message
    with pytest.raises(ferry.RpcError) as e:
        client.call("scale", {"x": {"$tensor": 3}})
    assert e.value.code == -32602
