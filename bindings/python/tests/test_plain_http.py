"""Plain JSON (newline-delimited, on the unix socket) and HTTP clients: inline tensors
both ways. The app is served from a thread of this process (`App.serve` with
`http="127.0.0.1:0"`, the address learned through `ready`), stopped with `App.stop`."""

from __future__ import annotations

import base64
import json
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import ferry
from tests import apps
from tests.conftest import WAIT, PlainJson, unique_addr


@dataclass
class Addrs:
    unix: str
    http: str


@pytest.fixture(scope="module")
def addrs() -> Iterator[Addrs]:
    ready: queue.Queue[list[str]] = queue.Queue()
    errors: list[BaseException] = []
    unix = unique_addr("http")

    def serve() -> None:
        try:
            apps.app.serve(unix, http="127.0.0.1:0", announce=False, ready=ready.put)
        except BaseException as e:
            errors.append(e)
            raise

    t = threading.Thread(target=serve, name="test-http-serve", daemon=True)
    t.start()
    try:
        got = ready.get(timeout=WAIT)
    except queue.Empty:
        pytest.fail(f"the server did not get ready: {errors}")
    assert got[0] == unix
    http = [a for a in got if a.startswith("http://")]
    assert len(http) == 1, got
    yield Addrs(unix, http[0])
    apps.app.stop()
    t.join(WAIT)
    assert not t.is_alive(), "App.serve did not return after App.stop()"
    assert not errors, errors
    # The app's event loop thread (for its async handlers) ended with it.
    loops = [x.name for x in threading.enumerate() if x.name == "ferry-ferrytest-loop"]
    assert loops == []


def inline(a: np.ndarray, dtype: str) -> dict[str, Any]:
    return {
        "$tensor": {
            "dtype": dtype,
            "shape": list(a.shape),
            "data": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode(),
        }
    }


def from_inline(v: dict[str, Any], np_dtype: Any) -> np.ndarray:
    t = v["$tensor"]
    return np.frombuffer(base64.b64decode(t["data"]), dtype=np_dtype).reshape(t["shape"])


def post(url: str, body: Any) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=WAIT) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        return json.loads(resp.read())


@pytest.fixture
def plain(addrs: Addrs) -> Iterator[PlainJson]:
    c = PlainJson(addrs.unix)
    yield c
    c.close()


def rpc(method: str, params: Any = None, id: Any = 1) -> dict[str, Any]:
    r = {"jsonrpc": "2.0", "method": method, "id": id}
    if params is not None:
        r["params"] = params
    return r


def test_plain_json_calls(plain: PlainJson) -> None:
    assert plain.call(rpc("add", [1, 2], id=7)) == {"jsonrpc": "2.0", "id": 7, "result": 3.0}
    r = plain.call(rpc("checkout", {"order": {"items": [{"name": "a", "price": 2}]}}, id="s"))
    assert r["id"] == "s"
    assert r["result"] == {"total": 2.0, "count": 1, "names": ["a"], "note": None}
    r = plain.call(rpc("add", {"a": 1, "b": "x"}))
    assert r["error"]["code"] == -32602
    assert r["error"]["data"]["path"] == "b"


def test_plain_json_inline_tensors(plain: PlainJson) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = plain.call(rpc("scale", {"x": inline(x, "f32"), "k": 2}))
    assert r["result"]["$tensor"]["dtype"] == "f32"
    assert r["result"]["$tensor"]["shape"] == [2, 3]
    np.testing.assert_array_equal(from_inline(r["result"], np.float32), x * 2)
    r = plain.call(rpc("inspect_array", [inline(x, "f32")]))
    assert r["result"]["writeable"] is False
    assert r["result"]["chain"][1:] == ["ferry._native.TensorRef"]
    assert r["result"]["sum"] == 15.0


def test_plain_json_nested_tensor_results(plain: PlainJson) -> None:
    x = np.array([5, 6, 7], dtype=np.int64)
    r = plain.call(rpc("bundle", [inline(x, "i64")]))["result"]
    assert r["n"] == 3
    np.testing.assert_array_equal(from_inline(r["twice"], np.int64), x * 2)
    np.testing.assert_array_equal(from_inline(r["parts"][1]["last"], np.int64), x[-1:])


def test_http_calls(addrs: Addrs) -> None:
    assert post(addrs.http, rpc("add", [1.5, 2]))["result"] == 3.5
    assert post(addrs.http, rpc("greet", {"name": "web"}))["result"] == "hello web"
    r = post(addrs.http, rpc("add", [1, 2, 3]))
    assert r["error"]["code"] == -32602
    r = post(addrs.http, rpc("crash", [1]))
    assert r["error"]["code"] == -32603
    assert r["error"]["data"]["reason"].startswith("ZeroDivisionError")


def test_http_inline_tensors(addrs: Addrs) -> None:
    x = np.linspace(0, 1, 5)
    r = post(addrs.http, rpc("scale", [inline(x, "f64"), 4]))["result"]
    assert r["$tensor"]["dtype"] == "f64"
    np.testing.assert_array_equal(from_inline(r, np.float64), x * 4)
    b = np.array([True, False, True])
    r = post(addrs.http, rpc("copy_of", [inline(b, "bool")]))["result"]
    np.testing.assert_array_equal(from_inline(r, np.bool_), b)
    r = post(addrs.http, rpc("inspect_array", [inline(x, "f64")]))["result"]
    assert r["writeable"] is False
    assert r["dtype"] == "float64"


def test_http_batch(addrs: Addrs) -> None:
    r = post(addrs.http, [rpc("add", [1, 1], id=1), rpc("maybe", [2], id=2)])
    assert sorted((x["id"], x["result"]) for x in r) == [(1, 2.0), (2, 20)]


def test_http_refuses_other_content_types(addrs: Addrs) -> None:
    req = urllib.request.Request(addrs.http, data=b"{}", headers={"Content-Type": "text/plain"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=WAIT)
    assert e.value.code == 415
    e.value.close()


def test_a_ferry_client_on_the_same_server(addrs: Addrs) -> None:
    with ferry.Client.connect(addrs.unix, timeout=WAIT) as c:
        assert c.channel == "shm"
        r = c.call("scale", [np.ones(3, np.float32), 2])
        np.testing.assert_array_equal(r, np.full(3, 2, np.float32))
