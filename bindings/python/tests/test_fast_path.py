"""The validation and encoding fast path for plain params and results (`float`, `int`,
`bool`, `str`, `np.ndarray`) must answer exactly as pydantic does: the same keyword
arguments, or no answer so that pydantic's own check (and error) runs. Each case runs the
signature with its fast path and again with it turned off, and compares."""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic
import pytest

import ferry
from ferry import _schema


def plain(a: float, b: int, c: bool, d: str = "x", e: float = 0.5) -> float:
    return a


def optional(a: float | None) -> float:
    return 0.0


def mutable_default(a: list[int] = []) -> int:  # noqa: B006 - the point of the test
    return 0


def with_context(a: float, ctx: ferry.Context) -> float:
    return a


def outcome(sig: _schema.Signature, params: object) -> tuple[str, Any]:
    try:
        kwargs = sig.validate(params, [])
    except pydantic.ValidationError as e:
        return ("error", [(err["loc"], err["type"]) for err in e.errors()])
    return ("ok", {k: (type(v), v) for k, v in kwargs.items()})


CASES: list[object] = [
    None,
    {},
    {"a": 1.5, "b": 2, "c": True},
    {"a": 1, "b": 2, "c": False},  # an int for a float: a float
    {"a": 2**60, "b": -(2**62), "c": True},
    {"a": 1.5, "b": 2.0, "c": True},  # a float for an int: refused (strict)
    {"a": 1.5, "b": True, "c": True},  # a bool for an int: refused
    {"a": True, "b": 1, "c": True},  # a bool for a float: refused
    {"a": "1.5", "b": 2, "c": True},  # a string for a float: refused
    {"a": 1.5, "b": 2, "c": 1},  # an int for a bool: refused
    {"a": 1.5, "b": 2, "c": True, "d": "y", "e": 3},
    {"a": 1.5, "b": 2, "c": True, "d": 7},
    {"a": 1.5, "b": 2, "c": True, "zzz": 1},  # an unknown param
    {"a": 1.5, "b": 2},  # a missing one
    {"a": None, "b": 2, "c": True},
    {"a": [1.0], "b": 2, "c": True},
]


@pytest.mark.parametrize("params", CASES)
def test_plain_params_as_pydantic_validates_them(params: object) -> None:
    fast = _schema.signature(plain, ferry.Context)
    assert fast.fast_params is not None
    slow = dataclasses.replace(fast, fast_params=None)
    assert outcome(fast, params) == outcome(slow, params)


def test_only_plain_signatures_take_the_fast_path() -> None:
    assert _schema.signature(optional, ferry.Context).fast_params is None
    assert _schema.signature(mutable_default, ferry.Context).fast_params is None
    sig = _schema.signature(with_context, ferry.Context)
    assert sig.fast_params is not None and list(sig.fast_params) == ["a"]
    assert sig.fast_result == "float"


@pytest.mark.parametrize(
    ("kind", "value", "text"),
    [
        ("float", 1.5, "1.5"),
        ("float", 1e300, "1e+300"),
        ("float", float("nan"), None),  # pydantic's path refuses it with its reason
        ("float", 3, None),  # not exactly a float: pydantic decides
        ("int", 3, "3"),
        ("int", True, None),
        ("bool", False, "false"),
        ("str", 'a "q" \u00e9', '"a \\"q\\" \\u00e9"'),
        ("str", b"x", None),
    ],
)
def test_plain_results_encode_as_json(kind: str, value: object, text: str | None) -> None:
    sig = dataclasses.replace(_schema.signature(plain, ferry.Context), fast_result=kind)
    assert sig.encode_fast(value) == text
