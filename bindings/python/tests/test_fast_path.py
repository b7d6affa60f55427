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


wrapped = ferry.App("plain-wrapper")


@wrapped.function
def add(a: float, b: float) -> float:
    return a + b


@wrapped.function
def label(n: int, on: bool, s: str) -> str:
    return f"{s}{n}" if on else s


@wrapped.function
def fails(a: float) -> float:
    raise ValueError(f"no {a}")


@wrapped.function
def lies(a: float) -> float:
    return "not a float"  # type: ignore[return-value]


@wrapped.function
def keyword_only(a: float, *, b: float) -> float:
    return a


WRAPPER_CASES: list[tuple[str, object]] = [
    ("add", {"a": 1.5, "b": 2.5}),
    ("add", {"a": 1, "b": 2}),  # ints for floats
    ("add", {"a": True, "b": 2}),
    ("add", {"a": 1.5}),
    ("add", {"a": 1.5, "b": 2, "c": 3}),
    ("add", {"a": 1.5, "c": 2}),
    ("add", None),
    ("add", b'{"a": 1, "b": 2}'),
    ("label", {"n": 3, "on": True, "s": "x"}),
    ("label", {"n": 3, "on": 1, "s": "x"}),
    ("label", {"n": 3.0, "on": True, "s": "x"}),
    ("label", {"n": 3, "on": False, "s": 7}),
    ("fails", {"a": 1.5}),
    ("lies", {"a": 1.5}),
    ("keyword_only", {"a": 1.5, "b": 2.0}),
]


@pytest.mark.parametrize(("name", "params"), WRAPPER_CASES)
def test_the_plain_wrapper_answers_as_call_sync(name: str, params: object) -> None:
    """The wrapper Rust calls for plain signatures (`_Function.sync_wrapper`) checks and
    encodes params and results itself: its outcome, ok or error, is `call_sync`'s."""
    f = wrapped._functions[name]
    assert f.sync_wrapper()(params, [], None) == f.call_sync(params, [], None)


def test_only_plain_positional_signatures_get_the_plain_wrapper() -> None:
    fs = wrapped._functions
    for name in ("add", "label", "fails", "lies"):
        assert fs[name].sync_wrapper() != fs[name].call_sync, name
    assert fs["keyword_only"].sync_wrapper() == fs["keyword_only"].call_sync
