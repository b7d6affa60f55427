"""What a server lets Python handlers hold (issue 43 point 2 and 4): a call cancelled or
abandoned while it waits for a handler thread never starts; a cancelled call's handler
still counts against its connection's `max_in_flight` and the server's
`max_running_handlers` until it returns; the wait queue is bounded by
`max_queued_handlers`; big JSON params are bounded by `max_param_bytes_in_flight` and
validated from their JSON bytes. Counts are small here; the full ones run in the soak
(`bench/soak_server.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import ferry
from tests import admission_app
from tests.conftest import WAIT, Background, PlainJson, unique_addr, wait_until

CANCELLED = -32002
LIMIT_EXCEEDED = -32001
INVALID_PARAMS = -32602


@pytest.fixture(scope="module")
def one_thread() -> Iterator[str]:
    """A server running one sync handler at a time, with one call waiting at most."""
    addr = unique_addr("gate1")
    with ferry.spawn(
        admission_app.app, addr, max_running_handlers=1, max_queued_handlers=2, max_in_flight=3
    ):
        yield addr


@pytest.fixture(scope="module")
def two_threads() -> Iterator[str]:
    addr = unique_addr("gate2")
    with ferry.spawn(
        admission_app.app, addr, max_running_handlers=2, max_param_bytes_in_flight=100_000
    ):
        yield addr


def request(method: str, params: Any, id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params, "id": id}


def cancel(plain: PlainJson, id: Any) -> dict[str, Any]:
    plain.send({"jsonrpc": "2.0", "method": "ferry.cancel", "params": {"id": id}})
    r: dict[str, Any] = plain.receive()
    return r


def drained(c: ferry.Client) -> None:
    """Returns once every call queued before now has been taken (the queue is FIFO: a
    call made now starts after them)."""
    assert c.call("add", [1, 2]) == 3


def test_cancelled_queued_call_never_starts(one_thread: str, key: str) -> None:
    held, queued = f"{key}-held", f"{key}-queued"
    with ferry.Client.connect(one_thread, timeout=WAIT) as c:
        first = Background(c, "block", [held])
        wait_until(lambda: c.call("running", [held]) == 1, "the first call to run")
        plain = PlainJson(one_thread)
        try:
            plain.send(request("block", [queued], "q-1"))
            r = cancel(plain, "q-1")
            assert r["id"] == "q-1"
            assert r["error"]["code"] == CANCELLED
        finally:
            plain.close()
        assert c.call("release", [held]) is True
        assert first.result() == "released"
        drained(c)
        assert c.call("starts", [queued]) == 0


def test_queued_call_of_closed_connection_never_starts(one_thread: str, key: str) -> None:
    """A ferry connection that closes cancels its calls (a plain JSON one that reaches end
    of input may only have shut down its writing side: its calls are answered)."""
    held, queued = f"{key}-held", f"{key}-queued"
    with ferry.Client.connect(one_thread, timeout=WAIT) as c:
        first = Background(c, "block", [held])
        wait_until(lambda: c.call("running", [held]) == 1, "the first call to run")
        other = ferry.Client.connect(one_thread, timeout=WAIT)
        try:
            # Two calls (notifications: sent without waiting) fill the queue
            # (max_queued_handlers=2), which the next call of the connection, read after
            # them, finds full. Then the connection goes.
            other.notify("block", [queued])
            other.notify("block", [queued])
            with pytest.raises(ferry.RpcError) as e:
                other.call("add", [1, 2])
            assert e.value.code == LIMIT_EXCEEDED
            assert e.value.data["limit"] == "max_queued_handlers"
        finally:
            other.close()
        assert c.call("release", [held]) is True
        assert first.result() == "released"
        drained(c)
        assert c.call("starts", [queued]) == 0


def test_full_queue_is_refused_naming_the_option(one_thread: str, key: str) -> None:
    held = f"{key}-held"
    with ferry.Client.connect(one_thread, timeout=WAIT) as c:
        first = Background(c, "block", [held])
        wait_until(lambda: c.call("running", [held]) == 1, "the first call to run")
        plain = PlainJson(one_thread)
        try:
            # max_queued_handlers=2: two wait, the third is refused at once.
            plain.send(request("add", [1, 1], 1))
            plain.send(request("add", [2, 2], 2))
            r = plain.call(request("add", [3, 3], 3))
            assert r["id"] == 3
            assert r["error"]["code"] == LIMIT_EXCEEDED
            assert r["error"]["data"]["limit"] == "max_queued_handlers"
            assert "max_queued_handlers" in r["error"]["message"]
            c.call("release", [held])
            assert first.result() == "released"
            answers = {plain.receive()["id"]: None for _ in range(2)}
            assert set(answers) == {1, 2}
        finally:
            plain.close()


def test_cancelled_running_handler_counts_against_max_in_flight(one_thread: str, key: str) -> None:
    """`max_in_flight=3`: a handler deaf to cancellation keeps its connection's place after
    its call is answered `cancelled`, until it returns; calls cancelled while they wait
    give theirs back at once, and never start."""
    held = f"{key}-held"
    with ferry.Client.connect(one_thread, timeout=WAIT) as c:
        plain = PlainJson(one_thread)
        try:
            plain.send(request("block", [held], "b-1"))
            wait_until(lambda: c.call("running", [held]) == 1, "the call to run")
            assert cancel(plain, "b-1")["error"]["code"] == CANCELLED
            assert c.call("running", [held]) == 1
            # Answered, but its handler still runs: two places are left.
            plain.send(request("block", [f"{key}-2"], "b-2"))
            plain.send(request("block", [f"{key}-3"], "b-3"))
            r = plain.call(request("add", [1, 2], "over"))
            assert r["id"] == "over"
            assert r["error"]["code"] == LIMIT_EXCEEDED
            assert r["error"]["data"]["limit"] == "max_in_flight"
            assert "max_in_flight" in r["error"]["message"]
            # The two waiting ones, cancelled, give their places back at once ...
            assert cancel(plain, "b-2")["error"]["code"] == CANCELLED
            assert cancel(plain, "b-3")["error"]["code"] == CANCELLED
            plain.send(request("add", [1, 2], "a-2"))
            plain.send(request("add", [1, 2], "a-3"))
            r = plain.call(request("add", [1, 2], "over-2"))
            assert r["error"]["data"]["limit"] == "max_in_flight"
            # ... and the running one once it returns.
            c.call("release", [held])
            got = {plain.receive()["id"] for _ in range(2)}
            assert got == {"a-2", "a-3"}
            wait_until(lambda: c.call("running", [held]) == 0, "the handler to return")
            for i in range(3):
                plain.send(request("add", [i, 1], f"c-{i}"))
            answers = [plain.receive() for _ in range(3)]
            assert sorted(a["result"] for a in answers) == [1.0, 2.0, 3.0]
            assert c.call("starts", [f"{key}-2"]) == 0
            assert c.call("starts", [f"{key}-3"]) == 0
        finally:
            plain.close()


def test_server_cap_holds_across_connections(two_threads: str, key: str) -> None:
    """`max_running_handlers=2`: of six calls from three connections two run at once, the
    others wait for them."""
    clients = [ferry.Client.connect(two_threads, timeout=WAIT) for _ in range(3)]
    try:
        calls = [Background(clients[i % 3], "block", [key]) for i in range(6)]
        wait_until(lambda: clients[0].call("running", [key]) == 2, "two handlers to run")
        clients[0].call("release", [key])
        assert [c.result() for c in calls] == ["released"] * 6
        assert clients[0].call("max_running", [key]) == 2
        assert clients[0].call("starts", [key]) == 6
    finally:
        for c in clients:
            c.close()


def test_big_params_wait_for_room(two_threads: str, key: str) -> None:
    """`max_param_bytes_in_flight=100_000`: calls with ~80 kB of params run one at a time
    (the server has two threads), small ones go by."""
    xs = [0.5] * 20_000  # "0.5," each: ~80 kB of JSON
    clients = [ferry.Client.connect(two_threads, timeout=WAIT) for _ in range(3)]
    try:
        calls = [Background(c, "total", [key, xs, 0.2]) for c in clients]
        assert [c.result() for c in calls] == [10_000.0] * 3
        assert clients[0].call("max_running", [key]) == 1
    finally:
        for c in clients:
            c.close()


def test_json_params_keep_strict_validation(two_threads: str) -> None:
    """Params that are not all plain types reach pydantic as JSON bytes: its strict JSON
    rules still hold (a list for a tuple, objects for models; no "1" for a float)."""
    with ferry.Client.connect(two_threads, timeout=WAIT) as c:
        r = c.call("centroid", {"points": [{"x": 1, "y": 2}, {"x": 3, "y": 4}], "scale": [2, 1]})
        assert r == {"x": 4.0, "y": 3.0}
        with pytest.raises(ferry.RpcError) as e:
            c.call("centroid", {"points": [{"x": "1", "y": 2}]})
        assert e.value.code == INVALID_PARAMS
        assert e.value.data["path"] == "points.0.x"
        with pytest.raises(ferry.RpcError) as e:
            c.call("total", ["k", [1.0, "2"]])
        assert e.value.code == INVALID_PARAMS
        assert e.value.data["path"] == "xs.1"
