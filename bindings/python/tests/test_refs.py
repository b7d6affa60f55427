"""Tensor references from a Python server (PROTOCOL.md section 21): a handler answers
with `ctx.keep(tensor)` / `ferry.keep(tensor)` instead of the bytes; the reference passes
back as a param without moving them, is fetched zero-copy over shm, dies with its
connection unless published, with its TTL, or freed; the server's limits name
themselves. Real server processes, real shm connections."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ferry
from ferry import TensorRef, refs
from tests.apps import mapping_of
from tests.conftest import WAIT, unique_addr, wait_until
from tests.refs_app import app

NOT_FOUND = -32009
LIMIT_EXCEEDED = -32001


@pytest.fixture(scope="module")
def addr() -> Iterator[str]:
    a = unique_addr("refs")
    with ferry.spawn(app, a, max_refs=64):
        yield a


@pytest.fixture
def client(addr: str) -> Iterator[ferry.Client]:
    with ferry.Client.connect(addr, timeout=WAIT) as c:
        yield c


def not_found(client: ferry.Client, r: TensorRef) -> bool:
    try:
        refs.fetch(client, r)
    except ferry.RpcError as e:
        assert e.code == NOT_FOUND, e
        assert isinstance(e.data, dict) and e.data.get("ref") == r.id, e.data
        return True
    return False


def test_a_handler_answers_with_a_reference(client: ferry.Client) -> None:
    r = client.call("embed", {"n": 1000})
    assert isinstance(r, TensorRef)
    assert (r.dtype, r.shape, r.nbytes, r.device) == ("f32", (1000,), 4000, "cpu")
    assert r.expires_ms is None and r.published is False
    assert r.id.startswith("r") and len(r.id) == 33
    assert [x.id for x in refs.list_refs(client)] == [r.id]


def test_a_reference_passes_as_a_param_without_moving_bytes(client: ferry.Client) -> None:
    r = client.call("embed", {"n": 100_000})
    seen = [client.call("where", {"x": r}) for _ in range(3)]
    expect = float(np.arange(100_000, dtype=np.float64).sum())
    for s in seen:
        assert (s["dtype"], s["shape"], s["sum"]) == ("float32", [100_000], expect)
        assert s["writeable"] is False
        # The kept copy: a shared segment of its own, the same memory at every call.
        assert s["mapping"].startswith("/memfd:ferry-shm"), s["mapping"]
    assert len({s["ptr"] for s in seen}) == 1, seen


def test_fetch_maps_the_servers_memory(client: ferry.Client) -> None:
    r = client.call("embed", {"n": 50_000})
    a = refs.fetch(client, r)
    b = refs.fetch(client, r)
    assert isinstance(a, np.ndarray) and not a.flags.writeable
    np.testing.assert_array_equal(a, np.arange(50_000, dtype=np.float32))
    assert mapping_of(a).startswith("/memfd:ferry-shm"), mapping_of(a)
    assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def test_typed_and_untyped_results_carry_references(client: ferry.Client) -> None:
    p = client.call("pair", {"n": 5})
    assert isinstance(p["grid"], TensorRef) and isinstance(p["ones"], TensorRef)
    assert (p["grid"].dtype, p["grid"].shape) == ("f64", (2, 5))
    assert (p["ones"].dtype, p["ones"].shape) == ("i16", (5,))
    np.testing.assert_array_equal(refs.fetch(client, p["grid"]), np.arange(10.0).reshape(2, 5))
    m = client.call("model", {"n": 3})
    assert m["note"] == "sevens" and isinstance(m["ref"], TensorRef)
    np.testing.assert_array_equal(refs.fetch(client, m["ref"]), [7, 7, 7])
    u = client.call("loose", {"n": 4})
    assert u["n"] == 4 and isinstance(u["ref"], TensorRef)
    assert client.call("where", {"x": u["ref"]})["sum"] == 4.0


def test_discover_types_reference_results(client: ferry.Client) -> None:
    doc: dict[str, Any] = client.call("rpc.discover")
    methods = {m["name"]: m for m in doc["methods"]}
    ref = {"$ref": "#/components/schemas/TensorRef"}
    assert methods["embed"]["result"]["schema"] == ref
    assert methods["pair"]["result"]["schema"]["additionalProperties"] == ref
    assert "TensorRef" in doc["components"]["schemas"]
    kept = methods["model"]["result"]["schema"]  # (a result model is written in place)
    assert kept["properties"]["ref"] == ref, kept


def test_references_die_with_their_connection_unless_published(addr: str) -> None:
    with ferry.Client.connect(addr, timeout=WAIT) as other:
        with ferry.Client.connect(addr, timeout=WAIT) as maker:
            gone = maker.call("embed", {"n": 10})
            kept = refs.publish(maker, maker.call("embed", {"n": 10}))
            assert kept.published
            # The same identity (this uid) may use the maker's references meanwhile.
            assert other.call("where", {"x": gone})["sum"] == 45.0
        wait_until(lambda: not_found(other, gone), "the closed connection's reference to go")
        np.testing.assert_array_equal(refs.fetch(other, kept), np.arange(10, dtype=np.float32))
        assert refs.free(other, kept) == 1
        assert not_found(other, kept)


def test_a_ttl_frees_a_reference(client: ferry.Client) -> None:
    r = client.call("embed", {"n": 10, "ttl": 0.2})
    assert r.expires_ms is not None
    wait_until(lambda: not_found(client, r), "the reference's TTL to pass")


def test_freed_and_unknown_references_are_not_found(client: ferry.Client) -> None:
    r = client.call("embed", {"n": 10})
    assert refs.free(client, r) == 1
    with pytest.raises(ferry.RpcError) as e:
        client.call("where", {"x": r})
    assert e.value.code == NOT_FOUND
    unknown = TensorRef(id="r" + "0" * 32, dtype="f32", shape=(10,))
    assert not_found(client, unknown)


def test_a_client_kept_tensor_lives_in_shared_memory(client: ferry.Client) -> None:
    r = refs.keep(client, np.arange(1000, dtype=np.float32))
    s = client.call("where", {"x": r})
    assert s["mapping"].startswith("/memfd:ferry-shm"), s
    assert s["sum"] == float(np.arange(1000).sum())


def test_the_reference_limit_names_itself() -> None:
    a = unique_addr("refs-limit")
    with ferry.spawn(app, a, max_refs=3) as c:
        with pytest.raises(ferry.RpcError) as e:
            c.call("keep_many", {"n": 4, "k": 4})
        assert e.value.code == LIMIT_EXCEEDED
        assert "max_refs" in json.dumps(e.value.data), e.value.data
        # The three kept before the refusal stay the caller's, so one more is refused too,
        # and a handler that catches the refusal says what it was.
        said = c.call("keep_caught", {"n": 4, "k": 1})
        assert said.startswith(f"{LIMIT_EXCEEDED}: ") and "max_refs" in said, said
        assert refs.free(c, *refs.list_refs(c)) == 3
        assert c.call("keep_caught", {"n": 4, "k": 1}) == "no limit"


def test_a_reference_is_not_a_param_type() -> None:
    bad = ferry.App("bad")

    def takes(r: TensorRef) -> float:
        return 0.0

    with pytest.raises(TypeError, match="param r cannot be a TensorRef"):
        bad.function(takes)


def test_keep_outside_a_handler_is_refused() -> None:
    with pytest.raises(RuntimeError, match="inside a handler"):
        ferry.keep(np.zeros(3))
