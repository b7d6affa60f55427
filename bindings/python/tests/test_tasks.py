"""Tasks: submitted, polled and fetched through `ferry.Client`."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from tests.conftest import wait_until

PENDING = -32005
NOT_FOUND = -32004


def test_submit_poll_fetch(client: ferry.Client, key: str) -> None:
    task = client.submit("gated_sum", {"key": key, "xs": [1, 2, 3.5]})
    assert isinstance(task, str) and task
    wait_until(lambda: client.call("record", [key]) == "running", "the task to start")
    status = client.task_status(task)
    assert status["task"] == task
    assert status["method"] == "gated_sum"
    assert status["state"] == "running"
    assert isinstance(status["elapsed_ms"], int)
    with pytest.raises(ferry.RpcError) as e:
        client.task_result(task)
    assert e.value.code == PENDING

    client.call("release", [key])
    wait_until(lambda: client.task_status(task)["state"] == "done", "the task to finish")
    assert client.task_result(task) == 6.5
    with pytest.raises(ferry.RpcError) as e:  # fetched: forgotten
        client.task_result(task)
    assert e.value.code == NOT_FOUND


def test_result_kept_and_waited_for(client: ferry.Client, key: str) -> None:
    task = client.submit("gated_sum", [key, [2, 2]], keep=True)
    client.call("release", [key])
    assert client.task_result(task, wait_ms=20_000) == 4.0
    assert client.task_result(task) == 4.0  # kept by the submit


def test_async_task_with_tensors(client: ferry.Client, key: str) -> None:
    x = np.arange(5, dtype=np.float32)
    task = client.submit("async_gated", {"key": key, "x": x})
    wait_until(lambda: client.call("record", [key]) == "running", "the task to start")
    assert client.task_status(task)["state"] == "running"
    client.call("release", [key])
    r = client.task_result(task, wait_ms=20_000)
    assert r["sum"] == 10.0
    np.testing.assert_array_equal(r["double"], x * 2)


def test_failed_task(client: ferry.Client) -> None:
    task = client.submit("crash", [1])
    wait_until(lambda: client.task_status(task)["state"] == "failed", "the task to fail")
    with pytest.raises(ferry.RpcError) as e:
        client.task_result(task)
    assert e.value.code == -32603
    assert e.value.data["reason"].startswith("ZeroDivisionError")


def test_submit_checks_the_method_and_param_names(client: ferry.Client) -> None:
    with pytest.raises(ferry.RpcError) as e:
        client.submit("no_such_method")
    assert e.value.code == -32601
    with pytest.raises(ferry.RpcError) as e:
        client.submit("add", {"a": 1, "b": 2, "c": 3})
    assert e.value.code == -32602
    assert e.value.data["path"] == "c"


def test_unknown_task(client: ferry.Client) -> None:
    with pytest.raises(ferry.RpcError) as e:
        client.task_status("t" + "0" * 32)
    assert e.value.code == NOT_FOUND
