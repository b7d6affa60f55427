"""Params and results from type hints: by position and by name, defaults, dataclasses,
TypedDicts, Literals, Optionals, nested containers, pydantic models; invalid params are
-32602 with pydantic's location."""

from __future__ import annotations

from typing import Any

import pytest

import ferry

INVALID_PARAMS = -32602


def invalid(client: ferry.Client, method: str, params: Any) -> ferry.RpcError:
    """The -32602 error `method(params)` answers."""
    with pytest.raises(ferry.RpcError) as info:
        client.call(method, params)
    e = info.value
    assert e.code == INVALID_PARAMS, e
    assert isinstance(e.data, dict), e
    return e


def test_add_by_position_and_by_name(client: ferry.Client) -> None:
    assert client.call("add", [1, 2]) == 3.0
    assert client.call("add", {"a": 1.5, "b": 2}) == 3.5
    assert client.call("add", {"b": 10, "a": -0.25}) == 9.75
    r = client.call("add", [2, 2])
    assert isinstance(r, float)


def test_defaults(client: ferry.Client) -> None:
    assert client.call("greet", {"name": "ann"}) == "hello ann"
    assert client.call("greet", ["bo"]) == "hello bo"
    assert client.call("greet", ["bo", "hi", 2]) == "hi bo hi bo"
    assert client.call("greet", {"name": "cy", "times": 3}) == "hello cy hello cy hello cy"


def test_dataclass_and_literal(client: ferry.Client) -> None:
    assert client.call("norm", {"p": {"x": 3, "y": -4}}) == 7.0
    assert client.call("norm", {"p": {"x": 3, "y": -4}, "mode": "l2"}) == 5.0
    assert client.call("norm", [{"x": 1, "y": 1}, "l1"]) == 2.0
    e = invalid(client, "norm", {"p": {"x": 3, "y": -4}, "mode": "l3"})
    assert e.data["path"] == "mode"
    assert e.message.startswith("Invalid params: mode: ")
    assert "'l1'" in e.data["reason"] and "'l2'" in e.data["reason"]


def test_dataclass_list_result(client: ferry.Client) -> None:
    r = client.call(
        "shift", {"points": [{"x": 1, "y": 2}, {"x": 0, "y": 0}], "by": {"x": 1, "y": 1}}
    )
    assert r == [{"x": 2, "y": 3}, {"x": 1, "y": 1}]
    e = invalid(client, "shift", {"points": [{"x": 1, "y": 2}, {"x": 1}], "by": {"x": 0, "y": 0}})
    assert e.data["path"] == "points.1.y"
    assert e.message == "Invalid params: points.1.y: Field required"


def test_typeddict_param_and_result(client: ferry.Client) -> None:
    r = client.call("grow", {"box": {"w": 1, "h": 2.5, "label": "ab"}})
    assert r == {"w": 2.0, "h": 5.0, "label": "AB"}
    assert client.call("grow", [{"w": 1, "h": 1, "label": "x"}, 3]) == {
        "w": 3.0,
        "h": 3.0,
        "label": "X",
    }
    e = invalid(client, "grow", {"box": {"w": 1, "h": 2}})
    assert e.data["path"] == "box.label"


def test_optional(client: ferry.Client) -> None:
    assert client.call("maybe") is None
    assert client.call("maybe", {}) is None
    assert client.call("maybe", {"x": None}) is None
    assert client.call("maybe", [4]) == 40
    e = invalid(client, "maybe", {"x": "4"})
    assert e.data["path"] == "x"


def test_nested_list_and_dict(client: ferry.Client) -> None:
    assert client.call("totals", {"groups": {"a": [1, 2, 3], "b": []}}) == {"a": 6, "b": 0}
    e = invalid(client, "totals", {"groups": {"a": [1, "two"]}})
    assert e.data["path"] == "groups.a.1"
    assert e.message.startswith("Invalid params: groups.a.1: ")
    e = invalid(client, "totals", {"groups": [1, 2]})
    assert e.data["path"] == "groups"


def test_pydantic_model_param_and_result(client: ferry.Client) -> None:
    order = {
        "items": [{"name": "pen", "qty": 3, "price": 1.5}, {"name": "pad", "price": 4}],
        "note": "rush",
        "tags": {"k": ["a", "b"]},
    }
    assert client.call("checkout", {"order": order}) == {
        "total": 8.5,
        "count": 4,
        "names": ["pen", "pad"],
        "note": "rush",
    }
    assert client.call("checkout", [{"items": []}]) == {
        "total": 0,
        "count": 0,
        "names": [],
        "note": None,
    }
    e = invalid(client, "checkout", {"order": {"items": [{"name": "pen"}]}})
    assert e.data["path"] == "order.items.0.price"
    assert e.message == "Invalid params: order.items.0.price: Field required"
    first = e.data["errors"][0]
    assert first["loc"] == ["order", "items", 0, "price"]
    assert first["type"] == "missing"


def test_unannotated_params_take_any_json(client: ferry.Client) -> None:
    assert client.call("untyped", [[1, {"x": None}]]) == {"a": [1, {"x": None}], "b": None}
    assert client.call("untyped", {"a": "s", "b": True}) == {"a": "s", "b": True}


def test_unknown_param(client: ferry.Client) -> None:
    e = invalid(client, "add", {"a": 1, "b": 2, "c": 3})
    assert e.data["path"] == "c"
    assert "c" in e.message and e.message.startswith("Invalid params: ")


def test_ill_typed_params(client: ferry.Client) -> None:
    e = invalid(client, "add", ["1", 2])
    assert e.data["path"] == "a"
    assert e.message.startswith("Invalid params: a: ")
    assert e.data["errors"][0]["loc"] == ["a"]
    # Strict: a bool is not an int, a number is not a string.
    e = invalid(client, "greet", {"name": "x", "times": True})
    assert e.data["path"] == "times"
    e = invalid(client, "greet", {"name": 5})
    assert e.data["path"] == "name"


def test_missing_params(client: ferry.Client) -> None:
    e = invalid(client, "add", {"a": 1})
    assert e.data["path"] == "b"
    assert e.data["reason"] == "Field required"
    e = invalid(client, "add", None)
    assert e.data["path"] in ("a", "b")
    e = invalid(client, "add", [1])
    assert e.data["path"] == "b"


def test_too_many_positional_params(client: ferry.Client) -> None:
    e = invalid(client, "add", [1, 2, 3])
    assert "3 params given by position; it takes 2 (a, b)" in e.message
    e = invalid(client, "maybe", [1, 2])
    assert "it takes 1 (x)" in e.message


def test_connection_survives_invalid_params(client: ferry.Client) -> None:
    for _ in range(3):
        invalid(client, "add", ["x", "y"])
    assert client.call("add", [20, 22]) == 42.0
