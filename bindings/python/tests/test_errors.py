"""Errors of handlers and results: `ferry.RpcError` as raised, other exceptions as
internal errors naming their type (a traceback only with `App(debug=True)`), results
that cannot be sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import ferry
from tests import apps
from tests.conftest import unique_addr

INTERNAL = -32603


def error(client: ferry.Client, method: str, params: Any = None) -> ferry.RpcError:
    with pytest.raises(ferry.RpcError) as info:
        client.call(method, params)
    return info.value


@pytest.mark.parametrize(
    "data",
    [None, {"x": 4, "nested": [1, "two"]}, [1, 2], "text"],
    ids=["none", "obj", "list", "str"],
)
def test_rpc_error_maps_through(client: ferry.Client, data: Any) -> None:
    e = error(client, "fail_rpc", {"code": -32010, "message": "custom failure", "data": data})
    assert e.code == -32010
    assert e.message == "custom failure"
    assert e.data == data


def test_rpc_error_with_a_positive_code(client: ferry.Client) -> None:
    e = error(client, "fail_rpc", [404, "not found"])
    assert (e.code, e.message, e.data) == (404, "not found", None)


def test_exception_is_internal_error_naming_its_type(client: ferry.Client) -> None:
    e = error(client, "crash", [3])
    assert e.code == INTERNAL
    assert e.message == "Internal error"
    assert e.data == {"reason": "ZeroDivisionError: integer division or modulo by zero"}


def test_async_exception(client: ferry.Client) -> None:
    e = error(client, "async_crash")
    assert e.code == INTERNAL
    assert e.data == {"reason": "LookupError: no such thing"}


@pytest.fixture(scope="module")
def debug_client() -> Iterator[ferry.Client]:
    with ferry.spawn(apps.debug_app, unique_addr("debug")) as c:
        yield c


def test_debug_app_sends_the_traceback(debug_client: ferry.Client) -> None:
    e = error(debug_client, "debug_crash", [1])
    assert e.code == INTERNAL
    assert e.data["reason"] == "ZeroDivisionError: integer division or modulo by zero"
    tb = e.data["traceback"]
    assert tb.startswith("Traceback (most recent call last):")
    assert "debug_crash" in tb
    assert "return x // 0" in tb


@pytest.mark.parametrize(
    ("method", "names"),
    [
        ("result_set", "builtins.set"),
        ("result_object", "builtins.object"),
        ("result_opaque", "tests.apps.Opaque"),
    ],
)
def test_unsupported_result_type(client: ferry.Client, method: str, names: str) -> None:
    e = error(client, method)
    assert e.code == INTERNAL
    reason = e.data["reason"]
    assert reason.startswith(f"the result of {method} cannot be sent: ")
    assert names in reason


def test_result_of_the_wrong_type(client: ferry.Client) -> None:
    e = error(client, "result_wrong_type")
    assert e.code == INTERNAL
    assert "the result of result_wrong_type cannot be sent" in e.data["reason"]
    assert "int" in e.data["reason"]


@pytest.mark.parametrize("method", ["result_nan", "result_nan_untyped", "result_inf_in_dict"])
def test_nan_result_is_an_error(client: ferry.Client, method: str) -> None:
    e = error(client, method)
    assert e.code == INTERNAL
    assert e.data["reason"].startswith(f"the result of {method} cannot be sent: ValueError")


def test_result_array_of_an_unsupported_dtype(client: ferry.Client) -> None:
    e = error(client, "result_str_array")
    assert e.code == INTERNAL
    assert "<U1" in e.data["reason"]


def test_unknown_method(client: ferry.Client) -> None:
    e = error(client, "no_such_method", [])
    assert e.code == -32601


def test_connection_survives_errors(client: ferry.Client) -> None:
    for method in ("crash", "result_set", "result_nan", "fail_rpc"):
        with pytest.raises(ferry.RpcError):
            client.call(
                method, [1, "x"] if method == "fail_rpc" else ([1] if method == "crash" else None)
            )
    assert client.call("add", [1, 1]) == 2.0
