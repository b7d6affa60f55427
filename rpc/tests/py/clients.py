"""A third-party JSON-RPC client (jsonrpcclient, PyPI) against `ferry serve`.

Run by `cli/tests/external_clients.rs` (through `cargo xtask ci`) as
`python clients.py unix:NAME http://HOST:PORT`. jsonrpcclient builds requests and parses
responses; the transports are the stdlib's: newline-delimited JSON over the unix socket
(abstract name) and HTTP POST with urllib. Prints one line per check and a closing
'N passed, N failed' line; exits non-zero on any failure.
"""

import base64
import json
import socket
import struct
import sys
import time
import urllib.error
import urllib.request

from jsonrpcclient import Error, Ok, notification, parse, request


class Socket:
    """Newline-delimited JSON-RPC over a unix socket."""

    def __init__(self, addr):
        name = addr.split(":", 1)[1]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(20)
        self.sock.connect(name if "/" in name else "\0" + name)
        self.buf = b""

    def send(self, obj):
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def call(self, obj):
        self.send(obj)
        return parse(self.recv())

    def close(self):
        self.sock.close()


class Http:
    """JSON-RPC over HTTP POST."""

    def __init__(self, url):
        self.url = url

    def post(self, obj):
        data = json.dumps(obj).encode()
        req = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def call(self, obj):
        status, body = self.post(obj)
        assert status == 200, (status, body)
        return parse(json.loads(body))


def tensor(dtype, shape, values):
    fmt = {"f32": "f", "f64": "d", "i32": "i", "i64": "q", "u8": "B"}[dtype]
    data = struct.pack(f"<{len(values)}{fmt}", *values)
    return {"$tensor": {"dtype": dtype, "shape": shape, "data": base64.b64encode(data).decode()}}


def values(t):
    t = t["$tensor"]
    fmt = {"f32": "f", "f64": "d", "i32": "i", "i64": "q", "u8": "B"}[t["dtype"]]
    raw = base64.b64decode(t["data"])
    return list(struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw))


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def both(fn):
    """Runs a check over the socket and over HTTP."""
    CHECKS.append(lambda s, h: fn(s))
    CHECKS[-1].__name__ = fn.__name__ + "[socket]"
    CHECKS.append(lambda s, h: fn(h))
    CHECKS[-1].__name__ = fn.__name__ + "[http]"
    return fn


@both
def by_position_and_by_name(c):
    assert c.call(request("add", params=(1, 2))).result == 3
    assert c.call(request("add", params={"b": 2.5, "a": 1})).result == 3.5


@both
def ids_are_echoed(c):
    for rid in [0, -5, "abc", "", 2**53]:
        r = c.call(request("add", params=(1, 1), id=rid))
        assert isinstance(r, Ok) and r.id == rid, r


@both
def errors(c):
    r = c.call(request("nope"))
    assert isinstance(r, Error) and r.code == -32601, r
    r = c.call(request("add", params={"a": "x", "b": 1}))
    assert isinstance(r, Error) and r.code == -32602 and r.data["path"] == "a", r


@both
def tensors_inline(c):
    r = c.call(request("create_tensor", params={"shape": [2, 2], "dtype": "f32", "fill": 1.5}))
    assert r.result["$tensor"]["shape"] == [2, 2], r
    assert values(r.result) == [1.5] * 4
    r = c.call(request("sum", params={"tensor": tensor("i32", [3], [1, 2, 3])}))
    assert r.result == 6, r
    a = tensor("f32", [1, 2], [1, 2])
    b = tensor("f32", [2, 1], [3, 4])
    r = c.call(request("matmul", params={"a": a, "b": b}))
    assert values(r.result) == [11.0], r
    r = c.call(request("weights"))
    assert sorted(r.result) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"], r
    r = c.call(request("describe", params={"weights": r.result}))
    assert r.result["fc1.weight"]["shape"] == [4, 8], r


@both
def discover(c):
    r = c.call(request("rpc.discover"))
    assert r.result["openrpc"].startswith("1.3"), r
    assert any(m["name"] == "matmul" for m in r.result["methods"])


@check
def batch_on_socket(s, h):
    s.send([request("add", params=(1, 2), id="a"), notification("add", (1, 1)), {"foo": 1},
            request("add", params=(2, 2), id="b")])
    rs = list(parse(s.recv()))
    assert [r.id for r in rs] == ["a", None, "b"], rs
    assert rs[0].result == 3 and rs[2].result == 4 and rs[1].code == -32600


@check
def batch_and_notifications_on_http(s, h):
    rs = list(h.call([request("add", params=(1, 2), id=1), request("add", params=(3, 4), id=2)]))
    assert [(r.id, r.result) for r in rs] == [(1, 3), (2, 7)], rs
    status, body = h.post(notification("add", (1, 2)))
    assert status == 204 and body == b"", (status, body)
    status, body = h.post([notification("add", (1, 2)), notification("add", (3, 4))])
    assert status == 204 and body == b"", (status, body)


@check
def pipelined_calls_answer_out_of_order(s, h):
    s.send(request("sleep", params={"ms": 300}, id="slow"))
    s.send(request("add", params=(1, 2), id="fast"))
    first, second = parse(s.recv()), parse(s.recv())
    assert (first.id, second.id) == ("fast", "slow"), (first, second)


@check
def tasks(s, h):
    # On the socket: the task belongs to this user and dies with this connection.
    r = s.call(request("ferry.task.submit", params={"method": "sleep", "params": {"ms": 100}}))
    task = r.result["task"]
    r = s.call(request("ferry.task.status", params={"task": task}))
    assert r.result["state"] in ("running", "done"), r
    r = s.call(request("ferry.task.result", params={"task": task, "wait_ms": 5000}))
    assert r.result == 100, r
    r = s.call(request("ferry.task.result", params={"task": task}))
    assert isinstance(r, Error) and r.code == -32004, r
    # Over HTTP (always detached): another identity than the socket's user, so the socket
    # cannot see it, exactly as if it did not exist.
    r = h.call(request("ferry.task.submit", params={"method": "sleep", "params": {"ms": 100}}))
    task = r.result["task"]
    r = s.call(request("ferry.task.status", params={"task": task}))
    assert isinstance(r, Error) and r.code == -32004, r
    r = h.call(request("ferry.task.result", params={"task": task, "wait_ms": 5000}))
    assert r.result == 100, r


@check
def cancel_by_notification(s, h):
    s.send(request("sleep", params={"ms": 60000}, id="long"))
    time.sleep(0.05)
    s.send(notification("ferry.cancel", {"id": "long"}))
    r = parse(s.recv())
    assert isinstance(r, Error) and r.id == "long" and r.code == -32002, r


def main():
    addr, url = sys.argv[1], sys.argv[2]
    passed = failed = 0
    for fn in CHECKS:
        s, h = Socket(addr), Http(url)
        try:
            fn(s, h)
            print(f"ok      {fn.__name__}")
            passed += 1
        except Exception as e:  # noqa: BLE001 - report every failure
            print(f"FAILED  {fn.__name__}: {type(e).__name__}: {e}")
            failed += 1
        finally:
            s.close()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
