"""`ferry.App` itself: what registering refuses, `ferry.empty` outside a handler, and
`serve_async` on a running event loop (with `ferry.AsyncClient`)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

import ferry
from ferry.errors import ConnectionClosed
from tests import apps
from tests.conftest import WAIT, unique_addr


def test_functions_in_order() -> None:
    names = apps.app.functions
    assert names[:3] == ["record", "release", "pid"]
    assert "add" in names and "sleeper" in names
    assert apps.debug_app.functions == ["debug_crash"]


def test_registration_refusals() -> None:
    app = ferry.App("refusals")

    @app.function
    def f() -> int:
        return 1

    with pytest.raises(ValueError, match="already registered"):
        app.function(f)
    for reserved in ("rpc.x", "ferry.y"):
        with pytest.raises(ValueError, match="reserved"):
            app.function(name=reserved)(f)
    with pytest.raises(ValueError, match="concurrency"):
        app.function(name="g", concurrency=0)(f)

    def star(*args: int) -> int:
        return 0

    with pytest.raises(TypeError, match=r"\*args"):
        app.function(star)
    assert app.functions == ["f"]


def test_renamed_and_documented() -> None:
    app = ferry.App("docs")

    @app.function(name="renamed", summary="Short.", description="Long.", deprecated=True)
    def original(x: int) -> int:
        """Ignored docstring."""
        return x

    (m,) = app.openrpc()["methods"][:1]
    assert m["name"] == "renamed"
    assert m["summary"] == "Short."
    assert m["description"] == "Long."
    assert m["deprecated"] is True


def test_empty_outside_a_handler() -> None:
    with pytest.raises(RuntimeError, match="inside a handler"):
        ferry.empty((2,), "f32")


def test_serve_async_with_async_client() -> None:
    """Async handlers run on the loop that awaits `serve_async`; cancelling it stops the
    server."""
    addr = unique_addr("aserve")
    ready = threading.Event()

    async def main() -> dict[str, Any]:
        server = asyncio.ensure_future(
            apps.app.serve_async(addr, announce=False, ready=lambda _: ready.set())
        )
        assert await asyncio.to_thread(ready.wait, WAIT)
        client = await ferry.AsyncClient.connect(addr)
        try:
            out = {
                "async": await client.call("async_add", [40, 2]),
                "sync": await client.call("add", [1, 2]),
                "tensor": await client.call("async_scale", [np.arange(3.0), 2]),
            }
        finally:
            await client.close()
        server.cancel()
        with pytest.raises(asyncio.CancelledError):
            await server
        return out

    out = asyncio.run(asyncio.wait_for(main(), WAIT))
    assert out["async"] == 42
    assert out["sync"] == 3.0
    np.testing.assert_array_equal(out["tensor"], np.arange(3.0) * 2)
    with pytest.raises(ConnectionClosed):  # nobody listens there any more
        ferry.Client.connect(addr)  # (one attempt: connect_timeout would wait for one)
