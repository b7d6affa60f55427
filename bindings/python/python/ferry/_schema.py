"""Params and results from type hints, with pydantic.

A function's params become a pydantic model (extra params forbidden, strict JSON
validation: `"1"` is not a float), its return annotation a `TypeAdapter`; both give the
JSON Schemas of the OpenRPC document, written with references into
`#/components/schemas`. Tensor types (`np.ndarray`, `torch.Tensor`, and the `NDArray`,
`TorchTensor`, `AnyTensor` aliases for use inside models) validate `{"$tensor": i}`
references into the received tensors and serialize to references into the sent ones.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import typing
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

import numpy as np
import pydantic
import typing_extensions
from pydantic import ConfigDict, PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError
from typing_extensions import is_typeddict

from . import _native, _tensors
from .refs import SCHEMA_MARK, TensorRef

REF_TEMPLATE = "#/components/schemas/{model}"
TENSOR_SCHEMA: dict[str, Any] = {"$ref": "#/components/schemas/Tensor"}
_TENSOR_MARK = "x-ferry-tensor"
"""pydantic resolves a `$ref` given with `WithJsonSchema` among its own definitions, so
tensor fields carry this mark and become `TENSOR_SCHEMA` afterwards (`_unmark`)."""
TENSOR_REF_SCHEMA: dict[str, Any] = {"$ref": "#/components/schemas/TensorRef"}
"""A `TensorRef` field's schema (pydantic gives `ferry.refs.SCHEMA_MARK`)."""


class Encoding:
    """What serializing one result needs: where tensors go and how to allocate them."""

    __slots__ = ("alloc", "allocated", "devices", "given", "outs")

    def __init__(
        self,
        alloc: _tensors.Alloc,
        allocated: list[_native.OutTensor],
        given: _tensors.Given | None = None,
        devices: _tensors.Devices | None = None,
    ) -> None:
        self.alloc = alloc
        self.allocated = allocated
        self.given: _tensors.Given = [] if given is None else given
        self.devices = devices
        self.outs: list[_tensors.Out] = []

    def ref(self, x: object) -> dict[str, int]:
        """`{"$tensor": i}` for `x`, which is appended to the outgoing tensors."""
        self.outs.append(_tensors.to_out(x, self.alloc, self.allocated, self.given, self.devices))
        return {"$tensor": len(self.outs) - 1}

    def fallback(self, x: object) -> Any:
        """What pydantic does with a value its type does not describe (`dict`, `Any`):
        tensors become references, numpy scalars numbers; anything else is refused."""
        if _tensors.is_tensor_like(x):
            return self.ref(x)
        if isinstance(x, TensorRef):
            return x.to_result_json()
        if isinstance(x, np.generic):
            return x.item()
        raise TypeError(f"cannot send a result of type {type(x).__module__}.{type(x).__qualname__}")


_INLINE_EXAMPLE = '{"$tensor": {"dtype": "f32", "shape": [2], "data": "<base64 of the bytes>"}}'
"""How a plain JSON client writes a tensor inline (PROTOCOL.md), for the errors."""


def _json_kind(value: object) -> str:
    """What a received JSON value is, in the words of someone who sent it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list (a nested list is not a tensor)"
    if isinstance(value, dict):
        return (
            'an object without a "$tensor" key'
            if "$tensor" not in value
            else ('a "$tensor" object that is not a tensor index')
        )
    return f"a {type(value).__qualname__}"


def _tensor_in(kind: str) -> Callable[[Any, pydantic.ValidationInfo], Any]:
    def validate(value: Any, info: pydantic.ValidationInfo) -> Any:
        if not isinstance(value, dict) and _tensors.is_tensor_like(value):
            return value  # a model built in Python (a result): the array itself
        refs = info.context.get("tensors") if isinstance(info.context, dict) else None
        i = value.get("$tensor") if isinstance(value, dict) and len(value) == 1 else None
        if refs is None or not isinstance(i, int) or isinstance(i, bool):
            raise PydanticCustomError(
                "tensor",
                "expected a tensor, got {got}: pass a numpy array or torch tensor from a "
                "ferry client (ferry.Client, a generated client), or from plain JSON {example}",
                {"got": _json_kind(value), "example": _INLINE_EXAMPLE},
            )
        if not 0 <= i < len(refs):
            raise PydanticCustomError(
                "tensor",
                "tensor index {i} out of range ({n} sent)",
                {"i": i, "n": len(refs)},
            )
        ref = refs[i]
        given = info.context.get("given") if isinstance(info.context, dict) else None
        if kind == "torch":
            t = _tensors.to_torch(ref)
            if given is not None and isinstance(ref, _native.DeviceTensor):
                given.append((t, ref))  # a view of it returned goes back by reference
            return t
        a = _tensors.to_numpy(ref)
        if given is not None:
            given.append((a, ref))
        return a

    return validate


def _tensor_out(value: Any, info: pydantic.SerializationInfo) -> Any:
    enc = info.context
    if not isinstance(enc, Encoding):
        raise TypeError("a tensor can only be serialized as a ferry result")
    return enc.ref(value)


def tensor_type(base: Any, kind: str) -> Any:
    """`base` as a pydantic type that travels as a ferry tensor (`kind`: numpy or torch)."""
    return Annotated[
        base,
        PlainValidator(_tensor_in(kind)),
        PlainSerializer(_tensor_out, when_used="always"),
        WithJsonSchema({_TENSOR_MARK: True}),
    ]


NDArray = tensor_type(np.ndarray, "numpy")
"""A numpy array parameter or result field (read-only, zero-copy when received)."""

AnyTensor = tensor_type(Any, "numpy")
"""Any tensor-like result field (numpy, torch, CuPy, DLPack); received as numpy."""


def _is_torch_tensor(tp: Any) -> bool:
    return getattr(tp, "__module__", "") == "torch" and getattr(tp, "__name__", "") == "Tensor"


def _is_cupy(tp: Any) -> bool:
    return (
        getattr(tp, "__module__", "").startswith("cupy")
        and getattr(tp, "__name__", "") == "ndarray"
    )


def rewrite(tp: Any) -> Any:
    """`tp` with every tensor type replaced by its ferry-aware pydantic type, through
    lists, dicts, tuples, unions, `Annotated`, dataclasses and TypedDicts."""
    if tp is np.ndarray or get_origin(tp) is np.ndarray:
        return NDArray
    if _is_torch_tensor(tp):
        return tensor_type(tp, "torch")
    if _is_cupy(tp):
        return tensor_type(Any, "numpy")
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or is_typeddict(tp)):
        return _rewrite_class(tp)
    origin = get_origin(tp)
    if origin is None:
        return tp
    args = get_args(tp)
    if origin is Annotated:
        inner = rewrite(args[0])
        if inner is args[0]:
            return tp
        params = (inner, *args[1:])
        return Annotated[params]
    new = tuple(rewrite(a) if not isinstance(a, list) else [rewrite(x) for x in a] for a in args)
    if all(n is a for n, a in zip(new, args, strict=True)):
        return tp
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return typing.Union[new]  # noqa: UP007 - built from a tuple
    if origin is Callable or str(origin) == "collections.abc.Callable":
        return tp
    generic: Any = origin
    try:
        return generic[new] if len(new) != 1 else generic[new[0]]
    except TypeError:
        base: Any = {list: typing.List, dict: typing.Dict, tuple: typing.Tuple}.get(origin)  # noqa: UP006
        return base[new] if base is not None else tp


_REWRITTEN: dict[type, type] = {}
"""Dataclasses and TypedDicts with tensor fields, and their ferry-aware counterparts (one
each, so that a class used in several places is one schema)."""
_REWRITING: set[type] = set()
"""Classes being rewritten now (a class that refers to itself keeps its own type there)."""


def _rewrite_class(cls: type) -> type:
    """`cls` (a dataclass or a TypedDict) with its fields' tensor types rewritten: itself
    when no field has one. A dataclass becomes a subclass of the same name, fields and
    options (its instances are instances of `cls`, with `cls`'s methods, and instances of
    `cls` are serialized by it); a TypedDict a TypedDict of the same name and keys."""
    done = _REWRITTEN.get(cls)
    if done is not None:
        return done
    if cls in _REWRITING:
        return cls
    _REWRITING.add(cls)
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
        new = {name: rewrite(tp) for name, tp in hints.items()}
    except (NameError, TypeError):
        return cls  # hints that do not resolve here: pydantic names the problem
    finally:
        _REWRITING.discard(cls)
    if all(new[n] is hints[n] for n in hints):
        return cls
    out: type
    if is_typeddict(cls):
        make_typeddict: Any = typing_extensions.TypedDict
        out = make_typeddict(cls.__name__, new, total=getattr(cls, "__total__", True))
    else:
        params: Any = getattr(cls, "__dataclass_params__", None)
        fields = [
            (
                f.name,
                new.get(f.name, f.type),
                dataclasses.field(
                    default=f.default,
                    default_factory=f.default_factory,
                    init=f.init,
                    repr=f.repr,
                    compare=f.compare,
                    metadata=f.metadata,
                    kw_only=f.kw_only,
                ),
            )
            for f in dataclasses.fields(cls)
        ]
        out = dataclasses.make_dataclass(
            cls.__name__,
            fields,
            bases=(cls,),
            frozen=bool(params and params.frozen),
            eq=bool(params is None or params.eq),
        )
    out.__qualname__ = cls.__qualname__
    out.__module__ = cls.__module__
    out.__doc__ = cls.__doc__
    _REWRITTEN[cls] = out
    return out


def _mentions(tp: Any, target: type) -> bool:
    """Whether `target` appears in the type `tp` (through generics, unions, `Annotated`)."""
    if tp is target:
        return True
    return any(
        _mentions(a, target) if not isinstance(a, list) else any(_mentions(x, target) for x in a)
        for a in get_args(tp)
    )


def _unmark(v: Any) -> Any:
    if isinstance(v, dict):
        for mark, schema in ((_TENSOR_MARK, TENSOR_SCHEMA), (SCHEMA_MARK, TENSOR_REF_SCHEMA)):
            if v.get(mark) is True:
                return {**schema, **{k: x for k, x in v.items() if k not in (mark, "title")}}
        return {k: _unmark(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_unmark(x) for x in v]
    return v


def _split_defs(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    schema = _unmark(schema)
    defs.update(schema.pop("$defs", {}))
    return schema


@dataclasses.dataclass
class Signature:
    """A function's params and result as ferry sees them."""

    names: list[str]
    """Params in positional order (the context param excluded)."""
    ctx_param: str | None
    """The param annotated `ferry.Context`, if any."""
    model: type[pydantic.BaseModel]
    result: pydantic.TypeAdapter[Any] | None
    """None: unannotated, encoded by `encode_any`."""
    params_schema: dict[str, Any]
    result_schema: dict[str, Any]
    defs: dict[str, Any]

    result_json: Callable[..., bytes] | None = None
    """`result`'s `dump_json` where it writes what `dump_python` + `json.dumps` would
    (plain types under `_RESULT_CONFIG`), else None."""

    fast_params: dict[str, tuple[str, Any]] | None = None
    """Where every param is a plain type (`_FAST`) with no default or an immutable one:
    each param's kind and default (`REQUIRED` if none), checked without pydantic for the
    params that pass these checks as pydantic's strict JSON validation would; None
    otherwise."""
    fast_result: str | None = None
    """The result's kind where it is a plain type (`_FAST`) or a numpy array, encoded
    without pydantic when the value is exactly of that type; None otherwise."""

    def validate(
        self,
        params: object,
        refs: list[_tensors.Received],
        given: _tensors.Given | None = None,
    ) -> dict[str, Any]:
        """The keyword arguments of a call, from its params by name (the server turns
        params by position into names): for a signature with `fast_params`, a `dict` as
        the server parsed them (None: no params); otherwise their compact JSON `bytes`,
        which pydantic parses and validates in one pass (no Python objects made twice, no
        `json.dumps`). Raises `pydantic.ValidationError`. Each numpy array handed out for
        a received tensor is appended to `given` with its tensor (a result that is one of
        them goes back as it is, without a look at its memory)."""
        fast = self.fast_params
        if type(params) is bytes:
            text: str | bytes = params
        else:
            if fast is not None and (params is None or type(params) is dict):
                kwargs = _fast_kwargs(fast, params or {}, refs, given)
                if kwargs is not None:
                    return kwargs
            text = "{}" if params is None else json.dumps(params, allow_nan=False)
        m = self.model.model_validate_json(
            text, strict=True, context={"tensors": refs, "given": given}
        )
        # The model forbids extra fields: its fields are the params (callers do not change it).
        return m.__dict__

    def encode_fast(self, result: object) -> str | None:
        """The result's JSON where it is exactly the plain type of its annotation (what
        pydantic would write, without it), else None (no tensors: see `_app`)."""
        kind = self.fast_result
        t = type(result)
        if kind == "float":
            if t is float and math.isfinite(result):  # type: ignore[arg-type]
                return repr(result)
        elif kind == "int":
            if t is int:
                return repr(result)
        elif kind == "bool":
            if t is bool:
                return "true" if result else "false"
        elif kind == "str" and t is str:
            return json.dumps(result)
        return None


REQUIRED: Any = object()
"""A param with no default (in `Signature.fast_params`)."""

_FAST: dict[Any, str] = {float: "float", int: "int", bool: "bool", str: "str"}
"""The plain param and result types validated and encoded without pydantic (tensors
too: `NDArray`, see `_fast_kind`)."""


def _fast_kind(tp: Any) -> str | None:
    """The fast path's kind of a (rewritten) type, if it has one."""
    if tp is NDArray:
        return "ndarray"
    return _FAST.get(tp) if isinstance(tp, type) else None


def _fast_kwargs(
    fast: dict[str, tuple[str, Any]],
    params: dict[str, Any],
    refs: list[_tensors.Received],
    given: _tensors.Given | None,
) -> dict[str, Any] | None:
    """The keyword arguments when every param passes pydantic's strict JSON check for its
    plain type (as pydantic would make them: an int for a float becomes a float, a
    `{"$tensor": i}` a read-only numpy view), else None: pydantic then validates them and
    names what is wrong."""
    if len(params) > len(fast):
        return None
    kwargs: dict[str, Any] = {}
    n = 0
    for name, (kind, default) in fast.items():
        if name not in params:
            if default is REQUIRED:
                return None
            kwargs[name] = default
            continue
        n += 1
        v = params[name]
        t = type(v)
        if kind == "float":
            if t is float:
                kwargs[name] = v
            elif t is int:
                kwargs[name] = float(v)
            else:
                return None
        elif kind == "ndarray":
            if t is not dict or len(v) != 1:
                return None
            i = v.get("$tensor")
            if type(i) is not int or not 0 <= i < len(refs):
                return None
            ref = refs[i]
            a = _tensors.to_numpy(ref)
            if given is not None:
                given.append((a, ref))
            kwargs[name] = a
        elif t is _FAST_TYPES[kind]:
            kwargs[name] = v
        else:
            return None
    if n != len(params):  # an unknown param: pydantic's error names it
        return None
    return kwargs


_FAST_TYPES: dict[str, type] = {v: k for k, v in _FAST.items()}


_SENDABLE = (
    "use JSON types (None, bool, int, float, str, list, dict, tuple, Literal, Optional), "
    "dataclasses, TypedDicts, pydantic models, np.ndarray or torch.Tensor, or leave it "
    "unannotated to take any JSON"
)
"""What a param or result may be annotated with, for the errors that refuse one."""

_SCHEMA_ERRORS = (
    pydantic.PydanticSchemaGenerationError,
    pydantic.PydanticInvalidForJsonSchema,
    pydantic.PydanticUserError,
)
"""What pydantic raises for a type it cannot validate or describe."""


def _unsendable(fn: Callable[..., Any], what: str, tp: Any) -> TypeError:
    """The error for `fn`'s `what` (a param or its result) annotated with `tp`, a type
    ferry cannot describe, in the words of the person who wrote the function."""
    name = getattr(tp, "__qualname__", None) or repr(tp)
    return TypeError(
        f"{fn.__qualname__}: {what} is annotated {name}, which ferry cannot receive or "
        f"send (it has no JSON form): {_SENDABLE}"
    )


def signature(fn: Callable[..., Any], context_type: type) -> Signature:
    """The `Signature` of `fn`, from its type hints (unannotated params take any JSON).
    Raises `TypeError` naming the param (or the result) whose type ferry cannot carry."""
    try:
        return _signature(fn, context_type)
    except NameError as e:
        raise TypeError(
            f"{fn.__qualname__}: its type hints do not resolve ({e}): import or define the "
            "types they name at the module's top level"
        ) from None


def _signature(fn: Callable[..., Any], context_type: type) -> Signature:
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    names: list[str] = []
    ctx_param = None
    fast: dict[str, tuple[str, Any]] | None = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(
                f"{fn.__qualname__}: *{p.name} and **{p.name} params cannot be described"
            )
        tp = hints.get(p.name, Any)
        if tp is context_type:
            ctx_param = p.name
            continue
        if _mentions(tp, TensorRef):
            raise TypeError(
                f"{fn.__qualname__}: param {p.name} cannot be a TensorRef: a reference the "
                "caller passes arrives as the tensor it names, so annotate it as a tensor "
                "(np.ndarray, torch.Tensor)"
            )
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (rewrite(tp), default)
        names.append(p.name)
        kind = _fast_kind(fields[p.name][0])
        if fast is not None and kind is not None and (default is ... or _immutable(default)):
            fast[p.name] = (kind, REQUIRED if default is ... else default)
        else:
            fast = None
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    try:
        model = pydantic.create_model(f"{fn.__name__}_params", __config__=config, **fields)
        params_json_schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    except _SCHEMA_ERRORS:
        for name, field in fields.items():  # which one: each alone, in the same model
            try:
                one = pydantic.create_model("one", __config__=config, **{name: field})
                one.model_json_schema(ref_template=REF_TEMPLATE)
            except _SCHEMA_ERRORS:
                raise _unsendable(fn, f"param {name}", hints.get(name, field[0])) from None
        raise
    defs: dict[str, Any] = {}
    params_schema = _split_defs(params_json_schema, defs)
    params_schema.pop("title", None)
    ret = hints.get("return", sig.return_annotation)
    result_json = None
    fast_result = _fast_kind(rewrite(ret)) if ret is not inspect.Signature.empty else None
    if ret is inspect.Signature.empty or ret is Any:
        result = None
        result_schema: dict[str, Any] = {}
    else:
        plain = _needs_config(ret)
        try:
            adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(
                rewrite(ret), config=_RESULT_CONFIG if plain else None
            )
            result_json_schema = adapter.json_schema(
                ref_template=REF_TEMPLATE, mode="serialization"
            )
        except _SCHEMA_ERRORS:
            raise _unsendable(fn, "its result", ret) from None
        result = adapter
        result_schema = _split_defs(result_json_schema, defs)
        if plain:
            result_json = adapter.dump_json
    return Signature(
        names,
        ctx_param,
        model,
        result,
        params_schema,
        result_schema,
        defs,
        result_json,
        fast,
        fast_result,
    )


def _immutable(v: object) -> bool:
    """Whether a default can be handed to every call as it is (pydantic copies others)."""
    return v is None or type(v) in (bool, int, float, str)


_RESULT_CONFIG = ConfigDict(arbitrary_types_allowed=True, ser_json_inf_nan="constants")
"""A result's config: NaN and infinities stay floats (pydantic's default turns those it
infers, under `Any` or `dict`, into `null`), so encoding them fails as it must."""


def _needs_config(tp: Any) -> bool:
    """Whether a TypeAdapter of `tp` may be given a config (not for models, dataclasses
    and TypedDicts, which carry their own; also behind `Annotated`, and TypedDicts of
    typing_extensions, which pydantic requires before Python 3.12)."""
    if get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return not (
        (isinstance(tp, type) and issubclass(tp, pydantic.BaseModel))
        or dataclasses.is_dataclass(tp)
        or is_typeddict(tp)
    )


def encode_any(x: object, enc: Encoding) -> Any:
    """JSON of an unannotated result: JSON types, tensors, pydantic models, dataclasses;
    anything else is a `TypeError` naming its type."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            if not isinstance(k, str):
                raise TypeError(f"a result dict key must be a str, not {type(k).__qualname__}")
            out[k] = encode_any(v, enc)
        return out
    if isinstance(x, (list, tuple)):
        return [encode_any(v, enc) for v in x]
    if _tensors.is_tensor_like(x):
        return enc.ref(x)
    if isinstance(x, TensorRef):  # (a dataclass, but sent in its wire form)
        return x.to_result_json()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, pydantic.BaseModel):
        return x.model_dump(mode="json", context=enc, warnings="error")
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: encode_any(getattr(x, f.name), enc) for f in dataclasses.fields(x)}
    raise TypeError(f"cannot send a result of type {type(x).__module__}.{type(x).__qualname__}")
