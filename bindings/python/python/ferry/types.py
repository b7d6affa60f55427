"""Checks of results against the types an API declares (used by generated clients).

A generated method checks its result with `check(result, spec, method, types)` before
returning it, so a server that answers with the wrong shape raises `ResultError` (naming
the method and where in the result) instead of handing back something the type hints do
not promise. Specs are small immutable objects: `NUMBER`, `ListOf(TENSOR)`,
`Object(required, optional, extra)`, `Ref("TypeName")`, ... Extra object keys are
allowed (the protocol ignores unknown fields).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import ResultError
from .refs import TensorRef

MAX_DEPTH = 256


def _is_tensor(v: object) -> bool:
    if isinstance(v, np.ndarray):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(v, torch.Tensor)


class Spec:
    """What a JSON value (with tensors as numpy arrays) must look like."""

    def check(self, value: object, path: str, types: Mapping[str, Spec], depth: int) -> None:
        """Raises `ResultError` if `value` (found at `path`) does not fit."""
        raise NotImplementedError

    def describe(self) -> str:
        """The spec in words, for error messages."""
        raise NotImplementedError


def _fail(path: str, spec: Spec, value: object) -> ResultError:
    shown = (
        f"array {value.dtype}{list(value.shape)}" if isinstance(value, np.ndarray) else repr(value)
    )
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ResultError(f"{path}: expected {spec.describe()}, got {shown}")


class _Simple(Spec):
    def __init__(self, name: str, ok: Any) -> None:
        self._name = name
        self._ok = ok

    def check(self, value: object, path: str, types: Mapping[str, Spec], depth: int) -> None:
        if not self._ok(value):
            raise _fail(path, self, value)

    def describe(self) -> str:
        return self._name


ANY: Spec = _Simple("anything", lambda v: True)
NULL: Spec = _Simple("null", lambda v: v is None)
BOOL: Spec = _Simple("a boolean", lambda v: isinstance(v, bool))
INTEGER: Spec = _Simple("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
NUMBER: Spec = _Simple(
    "a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
)
STRING: Spec = _Simple("a string", lambda v: isinstance(v, str))
TENSOR: Spec = _Simple("a tensor", lambda v: _is_tensor(v))
"""A numpy array, or a torch tensor (a client or call with `as_torch`)."""
TENSOR_REF: Spec = _Simple("a remote tensor reference", lambda v: isinstance(v, TensorRef))
"""A `ferry.TensorRef` (PROTOCOL.md section 21)."""


class ListOf(Spec):
    """A list whose items all fit `item`."""

    def __init__(self, item: Spec) -> None:
        self.item = item

    def check(self, value: object, path: str, types: Mapping[str, Spec], depth: int) -> None:
        if not isinstance(value, list):
            raise _fail(path, self, value)
        _deeper(path, depth)
        for i, v in enumerate(value):
            self.item.check(v, f"{path}[{i}]", types, depth + 1)

    def describe(self) -> str:
        return f"a list of {self.item.describe()}"


class TupleOf(Spec):
    """A list of exactly these items."""

    def __init__(self, *items: Spec) -> None:
        self.items = items

    def check(self, value: object, path: str, types: Mapping[str, Spec], depth: int) -> None:
        if not isinstance(value, list) or len(value) != len(self.items):
            raise _fail(path, self, value)
        _deeper(path, depth)
        for i, (v, s) in enumerate(zip(value, self.items, strict=False)):
            s.check(v, f"{path}[{i}]", types, depth + 1)

    def describe(self) -> str:
        return f"a list of {len(self.items)} items"


class MapOf(Spec):
    """An object whose values all fit `value` (e.g. a named tensor map)."""

    def __init__(self, value: Spec) -> None:
        self.value = value

    def check(self, value: object, path: str, types: Mapping[str, Spec], depth: int) -> None:
        if not isinstance(value, dict):
            raise _fail(path, self, value)
        _deeper(path, depth)
        for k, v in value.items():
            self.value.check(v, f"{path}[{k!r}]", types, depth + 1)

    def describe(self) -> str:
        return f"an object of {self.value.describe()}"


class OneOf(Spec):
    """One of these JSON values."""

    def __init__(self, *values: object) -> None:
        self.values = values

    def check(self, value: object, path: str, types: Mapping[str, Spec], depth: int) -> None:
        for v in self.values:
            if value == v and type(value) is type(v):
                return
        raise _fail(path, self, value)

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)


class AnyOf(Spec):
    """A value that fits at least one of `options`."""

    def __init__(self, *options: Spec) -> None:
        self.options = options

    def check(self, value: object, path: str, types: Mapping[str, Spec], depth: int) -> None:
        for o in self.options:
            try:
                o.check(value, path, types, depth)
                return
            except ResultError:
                continue
        raise _fail(path, self, value)

    def describe(self) -> str:
        return " or ".join(o.describe() for o in self.options)


class Object(Spec):
    """An object with these required and optional keys; other keys must fit `extra`, if
    given (else they are allowed and not checked)."""

    def __init__(
        self,
        required: Mapping[str, Spec],
        optional: Mapping[str, Spec],
        extra: Spec | None,
    ) -> None:
        self.required = dict(required)
        self.optional = dict(optional)
        self.extra = extra

    def check(self, value: object, path: str, types: Mapping[str, Spec], depth: int) -> None:
        if not isinstance(value, dict):
            raise _fail(path, self, value)
        _deeper(path, depth)
        for k, s in self.required.items():
            if k not in value:
                raise ResultError(f"{path}: the required field {k!r} is missing")
            s.check(value[k], f"{path}.{k}", types, depth + 1)
        for k, v in value.items():
            s2 = self.optional.get(k)
            if s2 is not None:
                s2.check(v, f"{path}.{k}", types, depth + 1)
            elif self.extra is not None and k not in self.required:
                self.extra.check(v, f"{path}[{k!r}]", types, depth + 1)

    def describe(self) -> str:
        return "an object with " + (", ".join(self.required) or "no required fields")


class Ref(Spec):
    """The named type `name` of the API (looked up in `types`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def check(self, value: object, path: str, types: Mapping[str, Spec], depth: int) -> None:
        spec = types.get(self.name)
        if spec is None:
            return  # a type the generator did not describe: anything goes
        _deeper(path, depth)
        spec.check(value, path, types, depth + 1)

    def describe(self) -> str:
        return self.name


def _deeper(path: str, depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise ResultError(f"{path}: nested deeper than {MAX_DEPTH} levels")


def check(value: object, spec: Spec, method: str, types: Mapping[str, Spec]) -> object:
    """`value` if it fits `spec`, else `ResultError` naming `method` and where."""
    try:
        spec.check(value, "result", types, 0)
    except ResultError as e:
        raise ResultError(f"{method}: {e}") from None
    return value
