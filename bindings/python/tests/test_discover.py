"""`rpc.discover`: the OpenRPC document a served app answers, and `App.openrpc()`."""

from __future__ import annotations

from typing import Any

import pytest

import ferry
from tests import apps

TENSOR = {"$ref": "#/components/schemas/Tensor"}


@pytest.fixture(scope="module")
def doc(served: Any) -> dict[str, Any]:
    with ferry.Client.connect(served.addr) as c:
        return c.discover()


def methods(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in doc["methods"]}


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """`schema`, or what its `$ref` into `#/components/schemas` names."""
    ref = schema.get("$ref")
    if ref is None:
        return schema
    prefix = "#/components/schemas/"
    assert ref.startswith(prefix), ref
    target: dict[str, Any] = doc["components"]["schemas"][ref.removeprefix(prefix)]
    return target


def refs(v: Any) -> list[str]:
    """Every `$ref` in `v`."""
    if isinstance(v, dict):
        found = [v["$ref"]] if isinstance(v.get("$ref"), str) else []
        return found + [r for x in v.values() for r in refs(x)]
    if isinstance(v, list):
        return [r for x in v for r in refs(x)]
    return []


def test_document(doc: dict[str, Any]) -> None:
    assert doc["openrpc"].startswith("1.3")
    assert doc["info"]["title"] == "ferrytest"
    assert doc["info"]["version"] == "1.2.3"
    assert doc["info"]["description"] == "The test suite's app."
    names = [m["name"] for m in doc["methods"]]
    assert set(apps.app.functions) <= set(names)
    assert {"ferry.cancel", "ferry.task.submit", "ferry.task.result"} <= set(names)
    assert "rpc.discover" not in names
    assert "x-ferry-errors" in doc


def test_a_task_function_is_marked_as_a_task(doc: dict[str, Any]) -> None:
    """`@app.function(task=True)` reaches the document as `x-ferry-task: true` (which
    generated clients turn into submit/status/result helpers); other functions have none."""
    ms = methods(doc)
    assert ms["gated_sum"]["x-ferry-task"] is True
    assert "x-ferry-task" not in ms["async_gated"]
    assert "x-ferry-task" not in ms["ferry.task.submit"]


def test_every_ref_resolves(doc: dict[str, Any]) -> None:
    all_refs = refs(doc)
    assert all_refs
    schemas = doc["components"]["schemas"]
    for r in all_refs:
        assert r.startswith("#/components/schemas/"), r
        assert r.removeprefix("#/components/schemas/") in schemas, r


def test_params_in_order_with_required_flags(doc: dict[str, Any]) -> None:
    m = methods(doc)
    add = m["add"]
    assert add["paramStructure"] == "either"
    assert [(p["name"], p["required"]) for p in add["params"]] == [("a", True), ("b", True)]
    assert [p["schema"]["type"] for p in add["params"]] == ["number", "number"]
    assert add["result"]["schema"]["type"] == "number"
    assert add["summary"] == "Adds two numbers."
    assert add["description"] == "The rest of the docstring is the description."

    greet = m["greet"]
    assert [(p["name"], p["required"]) for p in greet["params"]] == [
        ("name", True),
        ("greeting", False),
        ("times", False),
    ]
    assert greet["params"][1]["schema"]["default"] == "hello"
    assert greet["params"][2]["schema"]["default"] == 1
    assert greet["params"][2]["schema"]["type"] == "integer"

    maybe = m["maybe"]
    assert [(p["name"], p["required"]) for p in maybe["params"]] == [("x", False)]
    assert {"type": "null"} in maybe["params"][0]["schema"]["anyOf"]

    # The ferry.Context param is not a param of the method.
    assert [p["name"] for p in m["scale_ctx"]["params"]] == ["x", "k"]
    assert [p["name"] for p in m["spin"]["params"]] == ["key"]


def test_models_are_components(doc: dict[str, Any]) -> None:
    m = methods(doc)
    schemas = doc["components"]["schemas"]

    p = m["norm"]["params"][0]
    assert p["schema"] == {"$ref": "#/components/schemas/Point"}
    point = schemas["Point"]
    assert point["required"] == ["x", "y"]
    assert point["properties"]["x"]["type"] == "integer"
    assert m["norm"]["params"][1]["schema"]["enum"] == ["l1", "l2"]

    order = m["checkout"]["params"][0]
    assert order["schema"] == {"$ref": "#/components/schemas/Order"}
    items = schemas["Order"]["properties"]["items"]
    assert items["items"] == {"$ref": "#/components/schemas/Item"}
    assert set(schemas["Item"]["required"]) == {"name", "price"}
    receipt = resolve(doc, m["checkout"]["result"]["schema"])
    assert receipt["title"] == "Receipt"
    assert set(receipt["properties"]) == {"total", "count", "names", "note"}

    box = m["grow"]["params"][0]["schema"]
    assert box == {"$ref": "#/components/schemas/Box"}
    assert set(schemas["Box"]["required"]) == {"w", "h", "label"}

    shift = m["shift"]
    assert shift["params"][0]["schema"]["items"] == {"$ref": "#/components/schemas/Point"}
    assert shift["result"]["schema"]["items"] == {"$ref": "#/components/schemas/Point"}


def test_tensor_schemas(doc: dict[str, Any]) -> None:
    m = methods(doc)
    schemas = doc["components"]["schemas"]
    assert schemas["Tensor"]["required"] == ["$tensor"]
    assert "InlineTensor" in schemas

    scale = m["scale"]
    assert scale["params"][0] == {"name": "x", "required": True, "schema": TENSOR}
    assert scale["params"][1]["schema"]["default"] == 2.0
    assert scale["result"]["schema"] == TENSOR

    assert m["tensor_list"]["params"][0]["schema"]["items"] == TENSOR
    assert m["tensor_list"]["result"]["schema"]["items"] == TENSOR
    assert m["tensor_map"]["params"][0]["schema"]["additionalProperties"] == TENSOR
    opt = m["optional_tensors"]
    assert [(q["name"], q["required"]) for q in opt["params"]] == [("x", False), ("y", False)]
    for q in opt["params"]:
        assert TENSOR in q["schema"]["anyOf"] and {"type": "null"} in q["schema"]["anyOf"]
    assert TENSOR in opt["result"]["schema"]["anyOf"]
    sample = schemas["Sample"]
    assert sample["properties"]["x"] == TENSOR
    # Plain dataclasses and TypedDicts with numpy fields keep their names.
    assert schemas["Frame"]["properties"]["pixels"] == TENSOR
    assert schemas["Pair"]["properties"]["left"] == TENSOR
    assert resolve(doc, m["brighten"]["result"]["schema"])["properties"]["pixels"] == TENSOR
    assert resolve(doc, m["relabel"]["result"]["schema"])["properties"]["x"] == TENSOR


def test_task_and_docs(doc: dict[str, Any]) -> None:
    m = methods(doc)
    gated = m["gated_sum"]
    assert gated["summary"] == "Waits for `release(key)`, then sums."
    assert "ferry.task.submit" in gated["description"]
    assert "gated_sum" in gated["description"]


def test_app_openrpc_equals_discover(doc: dict[str, Any]) -> None:
    offline = apps.app.openrpc()
    assert offline["methods"] == doc["methods"]
    assert offline["components"]["schemas"] == doc["components"]["schemas"]
    assert offline["info"] == doc["info"]
