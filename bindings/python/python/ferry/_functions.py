"""`client.functions`: a server's functions as methods, without generated code.

Built from the server's OpenRPC document (`rpc.discover`, fetched once per client):

```python
c = ferry.Client.connect("unix:demo")
c.functions.add(1, 2)          # 3.0: a call of `add` with params {"a": 1, "b": 2}
c.functions.add(a=1, b=2)      # the same
help(c.functions.add)          # its description, params and result from the document
c.functions.ferry.task.status(task="...")  # a dotted name, one namespace per part
c.functions["add"](1, 2)       # any name, also one that is not an identifier
```

- Arguments: positional ones take the params in the document's order, keyword ones name
  them. They are sent by name (an object) unless the method's `paramStructure` is
  `"by-position"` (then a list, with a skipped optional param sent as its schema's
  default). A missing required param, an unknown or repeated one, or too many positional
  arguments raise `ParamsError` (a `TypeError`) naming the function and the param, with
  the closest names when one is misspelt, before anything is sent.
- An unknown function raises `UnknownFunctionError` (an `AttributeError`) naming it and
  the closest names the server has.
- `dir(c.functions)` (and so tab completion) lists the functions; each has a docstring
  and an `inspect.signature` from the document (`float` for a JSON number, `int`,
  `str`, `bool`, `list`, `dict`, `numpy.ndarray` for a tensor).
- With an `AsyncClient`, a call returns an awaitable (`await c.functions.add(1, 2)`);
  argument errors are raised at once, before any await.
- Call options: `c.functions.add.options(timeout=5, as_torch=True)(1, 2)`.
"""

from __future__ import annotations

import difflib
import inspect
import keyword
from collections.abc import Callable, Iterator
from typing import Any

from .errors import FerryError, ParamsError

_MISSING: Any = inspect.Parameter.empty

CallFn = Callable[..., Any]
"""`client.call`: `(method, params, *, timeout, as_torch)`, returning the result (or, on
an `AsyncClient`, an awaitable of it)."""


class UnknownFunctionError(FerryError, AttributeError):
    """The server has no function of that name (its OpenRPC document lists none);
    `name` is the name asked for, `suggestions` the closest names it has."""

    def __init__(self, name: str, known: list[str], where: str) -> None:
        self.suggestions = difflib.get_close_matches(
            name, list(dict.fromkeys(known)), n=3, cutoff=0.6
        )
        hint = (
            f"; did you mean {' or '.join(map(repr, self.suggestions))}?"
            if self.suggestions
            else ""
        )
        super().__init__(f"{where} has no function {name!r}{hint}")
        self.name = name


def _close(name: str, names: list[str]) -> str:
    near = difflib.get_close_matches(name, names, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""


class _Schemas:
    """The document's `components.schemas`, to follow `$ref`s and turn schemas into
    annotations."""

    def __init__(self, doc: dict[str, Any]) -> None:
        comps = doc.get("components")
        schemas = comps.get("schemas") if isinstance(comps, dict) else None
        self.schemas: dict[str, Any] = schemas if isinstance(schemas, dict) else {}

    def resolve(self, schema: object, depth: int = 0) -> dict[str, Any]:
        if not isinstance(schema, dict):
            return {}
        ref = schema.get("$ref")
        if isinstance(ref, str) and depth < 16:
            if ref.endswith("/Tensor"):
                return {"x-tensor": True}
            target = self.schemas.get(ref.rsplit("/", 1)[-1])
            return self.resolve(target, depth + 1)
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and depth < 16:
            return self.resolve(all_of[0], depth + 1)
        return schema

    def annotation(self, schema: object) -> Any:
        """A Python type for `schema` where it is plain, else `Any`."""
        s = self.resolve(schema)
        if s.get("x-tensor"):
            import numpy as np

            return np.ndarray
        for key in ("anyOf", "oneOf"):
            options = s.get(key)
            if isinstance(options, list):
                kinds = [
                    self.annotation(o) for o in options if self.resolve(o).get("type") != "null"
                ]
                if len(kinds) == 1 and len(options) == 2 and kinds[0] is not Any:
                    return kinds[0] | None
                return Any
        t = s.get("type")
        if isinstance(t, list):
            kinds = [x for x in t if x != "null"]
            base = _JSON_TYPES.get(kinds[0], Any) if len(kinds) == 1 else Any
            return base | None if base is not Any and "null" in t else base
        if isinstance(t, str):
            return _JSON_TYPES.get(t, Any)
        return Any


_JSON_TYPES: dict[str, Any] = {
    "number": float,
    "integer": int,
    "string": str,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


class _Param:
    __slots__ = ("default", "name", "required", "schema")

    def __init__(self, raw: dict[str, Any]) -> None:
        self.name = str(raw["name"])
        self.required = bool(raw.get("required", False))
        self.schema = raw.get("schema")
        d = self.schema.get("default", _MISSING) if isinstance(self.schema, dict) else _MISSING
        self.default = d


class Function:
    """One of the server's functions, callable: `f(*args, **kwargs)` calls it (see the
    module docs for how arguments become params)."""

    def __init__(
        self,
        method: dict[str, Any],
        call: CallFn,
        schemas: _Schemas,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.name: str = str(method["name"])
        """The method's name, as the server spells it."""
        self._method = method
        self._call = call
        self._schemas = schemas
        self._options = options or {}
        params = method.get("params")
        self._params = (
            [_Param(p) for p in params if isinstance(p, dict) and "name" in p]
            if isinstance(params, list)
            else []
        )
        self._names = [p.name for p in self._params]
        self.by_position = method.get("paramStructure") == "by-position"
        """Whether params are sent as a list (the method's `paramStructure`)."""
        self.__name__ = self.name.rsplit(".", 1)[-1]
        self.__qualname__ = self.name
        self.__doc__ = self._docstring()
        self.__signature__ = self._signature()

    def options(self, *, timeout: float | None = None, as_torch: bool | None = None) -> Function:
        """This function with call options (`timeout` seconds, results `as_torch`)."""
        opts = dict(self._options)
        if timeout is not None:
            opts["timeout"] = timeout
        if as_torch is not None:
            opts["as_torch"] = as_torch
        return Function(self._method, self._call, self._schemas, opts)

    def params(self, *args: Any, **kwargs: Any) -> dict[str, Any] | list[Any] | None:
        """The params a call with these arguments sends (`ParamsError` for arguments
        that do not fit)."""
        if len(args) > len(self._params):
            raise ParamsError(
                f"{self.name}() takes {len(self._params)} positional argument"
                f"{'' if len(self._params) == 1 else 's'} ({', '.join(self._names) or 'none'}) "
                f"but {len(args)} were given"
            )
        given: dict[str, Any] = dict(zip(self._names, args, strict=False))
        for k, v in kwargs.items():
            if k not in self._names:
                raise ParamsError(
                    f"{self.name}() got an unknown argument {k!r}{_close(k, self._names)}; "
                    f"its params: {', '.join(self._names) or 'none'}"
                )
            if k in given:
                raise ParamsError(f"{self.name}() got multiple values for argument {k!r}")
            given[k] = v
        missing = [p.name for p in self._params if p.required and p.name not in given]
        if missing:
            raise ParamsError(
                f"{self.name}() is missing required argument"
                f"{'' if len(missing) == 1 else 's'}: {', '.join(map(repr, missing))}"
            )
        if not self.by_position:
            return given if self._params else None
        out: list[Any] = []
        last = max((i for i, p in enumerate(self._params) if p.name in given), default=-1)
        for p in self._params[: last + 1]:
            if p.name in given:
                out.append(given[p.name])
            elif p.default is not _MISSING:
                out.append(p.default)
            else:
                raise ParamsError(
                    f"{self.name}() takes its params by position: {p.name!r} (no default) "
                    "must be given when a later one is"
                )
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(self.name, self.params(*args, **kwargs), **self._options)

    def _docstring(self) -> str:
        m = self._method
        lines = [str(m[k]) for k in ("summary", "description") if isinstance(m.get(k), str)]
        if len(lines) == 2 and lines[1].startswith(lines[0]):
            lines = lines[1:]
        if self._params:
            lines += ["", "Args:"]
            for p in self._params:
                s = p.schema if isinstance(p.schema, dict) else {}
                text = str(s.get("description", "")) or str(
                    self._schemas.resolve(s).get("description", "")
                )
                opt = "" if p.required else " (optional)"
                lines.append(f"    {p.name}{opt}: {text}".rstrip())
        result = m.get("result")
        if isinstance(result, dict):
            rs = result.get("schema")
            rtext = rs.get("description") if isinstance(rs, dict) else None
            if isinstance(rtext, str) and rtext:
                lines += ["", "Returns:", f"    {rtext}"]
        return "\n".join(lines)

    def _signature(self) -> inspect.Signature:
        params: list[inspect.Parameter] = []
        seen_default = False
        for p in self._params:
            if not p.name.isidentifier() or keyword.iskeyword(p.name):
                continue
            default = _MISSING if p.required else (None if p.default is _MISSING else p.default)
            seen_default = seen_default or default is not _MISSING
            kind = (
                inspect.Parameter.KEYWORD_ONLY
                if seen_default and default is _MISSING
                else inspect.Parameter.POSITIONAL_OR_KEYWORD
            )
            params.append(
                inspect.Parameter(
                    p.name, kind, default=default, annotation=self._schemas.annotation(p.schema)
                )
            )
        # a required param after an optional one becomes keyword-only: move those last
        params.sort(key=lambda q: q.kind == inspect.Parameter.KEYWORD_ONLY)
        result = self._method.get("result")
        ret = self._schemas.annotation(result.get("schema")) if isinstance(result, dict) else Any
        return inspect.Signature(params, return_annotation=ret)

    def __repr__(self) -> str:
        return f"<ferry function {self.name}{self.__signature__}>"


class Functions:
    """A server's functions as attributes (`client.functions.add(1, 2)`); a dotted name's
    parts are nested namespaces (`client.functions.ferry.task.status`); any name by item
    (`client.functions["add"]`)."""

    def __init__(
        self,
        doc: dict[str, Any],
        call: CallFn,
        where: str,
        prefix: str = "",
        made: dict[str, Function | Functions] | None = None,
    ) -> None:
        self._doc = doc
        self._call = call
        self._where = where
        self._prefix = prefix
        self._schemas = _Schemas(doc)
        methods = doc.get("methods")
        self._methods: dict[str, dict[str, Any]] = {
            str(m["name"]): m
            for m in (methods if isinstance(methods, list) else [])
            if isinstance(m, dict) and isinstance(m.get("name"), str)
        }
        self._made: dict[str, Function | Functions] = {} if made is None else made
        """Functions and namespaces made so far, by full name (shared by the nested
        namespaces: one object per name)."""

    def _children(self) -> list[str]:
        """The names one level below this namespace."""
        out: set[str] = set()
        for name in self._methods:
            if name.startswith(self._prefix):
                out.add(name[len(self._prefix) :].split(".", 1)[0])
        return sorted(out)

    def __getitem__(self, name: str) -> Function:
        """The function called `name` (the full name, dots included)."""
        full = name if not self._prefix or name.startswith(self._prefix) else self._prefix + name
        m = self._methods.get(full)
        if m is None:
            raise UnknownFunctionError(name, list(self._methods), self._where)
        f = self._made.get(full)
        if not isinstance(f, Function):
            f = Function(m, self._call, self._schemas)
            self._made[full] = f
        return f

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        full = self._prefix + name
        made = self._made.get(full)
        if made is not None:
            return made
        if full in self._methods:
            return self[full]
        if any(m.startswith(full + ".") for m in self._methods):
            ns = Functions(self._doc, self._call, self._where, full + ".", self._made)
            self._made[full] = ns
            return ns
        raise UnknownFunctionError(full, [*self._methods, *self._children()], self._where)

    def __dir__(self) -> list[str]:
        return [n for n in self._children() if n.isidentifier() and not keyword.iskeyword(n)]

    def __iter__(self) -> Iterator[str]:
        """The full names of the functions in this namespace."""
        return iter(sorted(n for n in self._methods if n.startswith(self._prefix)))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (
            self._prefix + name in self._methods or name in self._methods
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"<ferry functions of {self._where}: {', '.join(self._children())}>"


__all__ = ["Function", "Functions", "UnknownFunctionError"]
