"""Remote tensor references from Python against `ferry serve` (the demo API): a tensor
kept on the server, passed back as a param without its bytes, fetched zero-copy over shm,
freed, published, and gone with the connection that made it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from ferry import Client, RpcError, TensorRef
from ferry.generated.demo import DemoClient, NotFoundError
from ferry.refs import fetch, free, keep, list_refs, publish
from tests.client.servers import Server

NOT_FOUND = -32009


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server("demo")
    yield s
    s.kill()


def test_a_kept_tensor_passes_by_reference_and_fetches_zero_copy(
    server: Server,
) -> None:
    a = np.arange(1000, dtype=np.float32)
    with Client.connect(server.addr) as c:
        r = keep(c, a)
        assert isinstance(r, TensorRef) and r.id.startswith("r") and len(r.id) == 33
        assert (r.dtype, r.shape, r.nbytes, r.published) == (
            "f32",
            (1000,),
            4000,
            False,
        )
        # As a param where a tensor is taken: the server's copy, no bytes sent.
        assert c.call("sum", {"tensor": r}) == float(a.sum())
        # The bytes when wanted: twice, one mapping of the server's memory (lent).
        x, y = fetch(c, r), fetch(c, r)
        assert np.array_equal(x, a) and not x.flags.writeable
        assert x.__array_interface__["data"][0] == y.__array_interface__["data"][0]
        # A reference inside a result of a method that echoes its param back as a tensor.
        back = c.call("echo", {"tensor": r})
        assert np.array_equal(back, a)
        assert [t.id for t in list_refs(c)] == [r.id]
        assert free(c, r) == 1 and free(c, r) == 0
        with pytest.raises(RpcError) as e:
            c.call("sum", {"tensor": r})
        assert e.value.code == NOT_FOUND
        with pytest.raises(RpcError) as e:
            fetch(c, TensorRef("r" + "0" * 32, "f32", (1,)))
        assert e.value.code == NOT_FOUND


def test_references_die_with_their_connection_unless_published(server: Server) -> None:
    with Client.connect(server.addr) as c:
        gone = keep(c, np.ones(4, np.float32))
        kept = publish(c, keep(c, np.full(4, 2, np.float32)))
        assert kept.published
        short = keep(c, np.ones(1, np.float32), ttl=0.001)
        assert short.expires_ms is not None
    with Client.connect(server.addr) as c:
        # The server frees the first once it has seen the close: a bounded wait.
        for _ in range(400):
            try:
                fetch(c, gone)
            except RpcError as err:
                assert err.code == NOT_FOUND
                break
            time.sleep(0.01)
        else:
            pytest.fail("a reference outlived its connection")
        assert np.array_equal(fetch(c, kept), np.full(4, 2, np.float32))
        with pytest.raises(RpcError) as expired:
            fetch(c, short)
        assert expired.value.code == NOT_FOUND
        assert free(c, kept) == 1


def test_the_generated_client_takes_a_reference_for_a_tensor_param(
    server: Server,
) -> None:
    # Typed `TensorParam` (mypy --strict checks these calls): a TensorRef, as the server
    # takes one wherever it takes a tensor; results stay arrays.
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    with DemoClient.connect(server.addr) as demo:
        r = keep(demo.client, a)
        assert demo.sum(r) == float(a.sum())
        back = demo.echo(r)
        assert isinstance(back, np.ndarray) and np.array_equal(back, a)
        assert np.array_equal(demo.matmul(r, a.T.copy()), a @ a.T)
        described = demo.describe({"w": r, "b": np.ones(2, np.float32)})
        assert described["w"]["sum"] == float(a.sum())
        assert free(demo.client, r) == 1
        with pytest.raises(NotFoundError):
            demo.sum(r)
