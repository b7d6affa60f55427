"""Cancellation of sync and async handlers, the concurrency cap, and hung handlers that
must not hold up other calls. What a handler saw is read back through `record`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest

import ferry
from ferry.errors import CallTimeout, ConnectionClosed
from tests import apps
from tests.conftest import WAIT, Background, PlainJson, Served, unique_addr, wait_until

CANCELLED = -32002


def recorded(client: ferry.Client, key: str, value: str) -> Callable[[], bool]:
    return lambda: client.call("record", [key]) == value


@pytest.mark.parametrize("method", ["spin", "wait_cancel"])
def test_sync_handler_sees_client_timeout(client: ferry.Client, key: str, method: str) -> None:
    with pytest.raises(CallTimeout):
        client.call(method, [key], timeout=0.3)
    wait_until(recorded(client, key, "cancelled"), f"{method} to see the cancellation")


def test_sync_handler_sees_task_cancel(client: ferry.Client, key: str) -> None:
    task = client.submit("spin", {"key": key})
    wait_until(recorded(client, key, "running"), "the task to start")
    status = client.task_cancel(task)
    assert status["state"] == "cancelled"
    assert status["task"] == task
    wait_until(recorded(client, key, "cancelled"), "spin to see the cancellation")
    assert client.task_status(task)["state"] == "cancelled"


def test_sync_handler_sees_connection_close(served: Served, client: ferry.Client, key: str) -> None:
    other = ferry.Client.connect(served.addr, timeout=WAIT)
    call = Background(other, "wait_cancel", [key])
    wait_until(recorded(client, key, "running"), "the call to start")
    other.close()
    assert isinstance(call.result(), ConnectionClosed)
    wait_until(recorded(client, key, "cancelled"), "wait_cancel to see the cancellation")


def test_async_handler_cancelled_on_client_timeout(client: ferry.Client, key: str) -> None:
    with pytest.raises(CallTimeout):
        client.call("sleeper", [key], timeout=0.3)
    wait_until(recorded(client, key, "cancelled"), "CancelledError in the coroutine")


def test_async_handler_cancelled_by_task_cancel(client: ferry.Client, key: str) -> None:
    task = client.submit("sleeper", [key])
    wait_until(recorded(client, key, "running"), "the task to start")
    assert client.task_cancel(task)["state"] == "cancelled"
    wait_until(recorded(client, key, "cancelled"), "CancelledError in the coroutine")
    with pytest.raises(ferry.RpcError) as e:
        client.task_result(task)
    assert e.value.code in (CANCELLED, -32004)


def test_async_handler_cancelled_by_ferry_cancel(
    served: Served, client: ferry.Client, key: str
) -> None:
    """`ferry.cancel` by id, from a plain JSON connection (which picks its own ids)."""
    plain = PlainJson(served.addr)
    try:
        plain.send({"jsonrpc": "2.0", "method": "sleeper", "params": [key], "id": "nap-1"})
        wait_until(recorded(client, key, "running"), "the call to start")
        plain.send({"jsonrpc": "2.0", "method": "ferry.cancel", "params": {"id": "nap-1"}})
        r = plain.receive()
        assert r["id"] == "nap-1"
        assert r["error"]["code"] == CANCELLED
    finally:
        plain.close()
    wait_until(recorded(client, key, "cancelled"), "CancelledError in the coroutine")


def test_sync_handler_deaf_to_cancel_is_answered_at_once(
    served: Served, client: ferry.Client, key: str
) -> None:
    """`ferry.cancel` answers a sync call whose handler ignores it while the handler still
    runs (its thread writes responses itself, but does not hold the call's answer), and the
    handler's own outcome, when it comes, goes nowhere."""
    plain = PlainJson(served.addr)
    try:
        plain.send({"jsonrpc": "2.0", "method": "hang", "params": [key], "id": "hung-1"})
        wait_until(recorded(client, key, "running"), "the call to start")
        plain.send({"jsonrpc": "2.0", "method": "ferry.cancel", "params": {"id": "hung-1"}})
        r = plain.receive()
        assert r["id"] == "hung-1"
        assert r["error"]["code"] == CANCELLED
        # Answered while the handler is still blocked in it.
        assert client.call("record", [key]) == "running"
        assert client.call("release", [key]) is True
        wait_until(recorded(client, key, "released"), "the handler to end")
        # The connection goes on: the late outcome was dropped, not sent.
        plain.send({"jsonrpc": "2.0", "method": "add", "params": [1, 2], "id": 7})
        assert plain.receive() == {"jsonrpc": "2.0", "result": 3.0, "id": 7}
    finally:
        plain.close()


def test_async_results(client: ferry.Client) -> None:
    assert client.call("async_add", [2, 3]) == 5
    assert client.call("async_add", {"a": -1, "b": 1}) == 0


def test_concurrency_cap(served: Served, key: str) -> None:
    clients = [ferry.Client.connect(served.addr, timeout=WAIT) for _ in range(2)]
    try:
        calls = [Background(clients[i % 2], "capped", [key, 0.05]) for i in range(6)]
        assert [c.result() for c in calls] == [1] * 6
        assert clients[0].call("max_seen", [key]) == 1
    finally:
        for c in clients:
            c.close()


def test_uncapped_calls_run_together(served: Served, key: str) -> None:
    """The control of the cap: without one, 4 calls are inside the handler at once (each
    waits on a barrier of 4)."""
    clients = [ferry.Client.connect(served.addr, timeout=WAIT) for _ in range(2)]
    try:
        calls = [Background(clients[i % 2], "gather", [key, 4]) for i in range(4)]
        assert [c.result() for c in calls] == [True] * 4
        assert clients[0].call("max_seen", [key]) == 4
    finally:
        for c in clients:
            c.close()


def test_calls_on_one_connection_run_together_after_a_followed_call(
    served: Served, key: str
) -> None:
    """A handler thread that answered a call reads its connection's next request itself
    (after plain calls, the first `gather` is read there); while that call runs, a request
    sent later on the same connection is still read and run beside it (the two wait for
    each other on a barrier of 2)."""
    c = ferry.Client.connect(served.addr, timeout=WAIT)
    probe = ferry.Client.connect(served.addr, timeout=WAIT)
    try:
        for r in range(5):
            for _ in range(20):
                assert c.call("add", [1, 2]) == 3
            k = f"{key}-{r}"
            first = Background(c, "gather", [k, 2])
            wait_until(partial(probe.call, "max_seen", [k]), "the first call to start")
            second = Background(c, "gather", [k, 2])
            assert [first.result(), second.result()] == [True, True]
    finally:
        c.close()
        probe.close()


def test_hung_handler_does_not_block_others(served: Served, client: ferry.Client, key: str) -> None:
    hung = ferry.Client.connect(served.addr, timeout=WAIT)
    try:
        call = Background(hung, "hang", [key])
        wait_until(recorded(client, key, "running"), "the hung call to start")
        # Another client, and the hung client itself, are served meanwhile.
        assert client.call("add", [1, 2]) == 3.0
        assert client.call("async_add", [1, 2]) == 3
        assert hung.call("greet", ["you"]) == "hello you"
        assert client.call("record", [key]) == "running"
        assert client.call("release", [key]) is True
        assert call.result() == "released"
    finally:
        hung.close()


def test_cancel_interrupts_an_alloc_waiting_for_room(key: str) -> None:
    addr = unique_addr("pool")
    with ferry.spawn(apps.app, addr, shm_pool_mib=2) as c:
        held = c.call("fill", [f"{key}-1", 1_500_000])  # most of the 2 MiB pool, kept
        try:
            # The second result cannot fit until `held` is released: the call waits in
            # `ferry.empty`, times out on the client, and the cancellation ends the wait.
            with pytest.raises(CallTimeout):
                c.call("fill", [key, 1_500_000], timeout=1.0)
            wait_until(
                lambda: c.call("record", [key]).startswith("alloc failed"),
                "the cancelled alloc to give up",
                timeout=10.0,
            )
            assert "cancelled" in c.call("record", [key])
        finally:
            del held  # lets a still-waiting alloc through, so the child stops at once
            c.flush_releases()


def test_calls_arriving_together_do_not_wait_for_each_other(key: str) -> None:
    """A batch of a hung call and the call that releases it, on a server with one idle
    handler thread: each call gets a thread of its own. (The pool once spawned a thread
    only when none counted as idle, and an idle thread counted until it woke up: the
    release queued behind the hung call in most tries. Each try needs a fresh server,
    with exactly one idle thread.)"""
    for attempt in range(3):
        addr = unique_addr(f"burst{attempt}")
        k = f"{key}-{attempt}"
        with ferry.spawn(apps.app, addr) as c:
            assert c.call("add", [1, 2]) == 3.0  # one handler thread, now idle
            try:
                # (A bound, not a measurement: the batch takes milliseconds unless stuck.)
                assert c.batch([("hang", [k]), ("release", [k])], timeout=5.0) == [
                    "released",
                    True,
                ]
            finally:
                with ferry.Client.connect(addr, timeout=WAIT) as other:
                    other.call("release", [k])  # (unsticks a stuck batch)
