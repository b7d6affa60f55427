"""JSON-RPC 2.0 over ferry messages, sans-IO: the layer above the message-level
`_session.Session`.

- `RpcSession`: one connection's JSON-RPC state: request ids, calls and batches as
  messages to write, and the responses in a received frame as (id, outcome).
- The codec it uses: requests as JSON text with tensors as `{"$tensor": i}` references
  (`request_json`, `params_json`, `encode_params`), and responses back to results with
  their tensors resolved (`responses`, `resolve_tensors`).
- The params of `ferry.task.submit`, and what the `ferry.task.*` and `rpc.discover`
  answers must look like (`submit_params`, `submit_answer`, `status_answer`,
  `discover_answer`), for both clients.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from ._cuda import cuda_array
from ._cuda_channel import dtype_of
from ._outgoing import ENCODER, Outgoing, TensorRefs, little_endian
from ._session import PEER_FAULTS, Session
from ._wire import Frame, byte_span
from .errors import ParamsError, ProtocolError, ResultError, RpcError
from .rpc_errors import error_from_code
from .refs import REF_KEY, TensorRef
from .tensors import NUMPY_DTYPES, Tensor, ferry_dtype, typed_view

MAX_PARAM_DEPTH = 256

Outcome = Union[object, RpcError, ResultError]
"""A call's result, or the error it ended with."""


class RpcSession:
    """The JSON-RPC state of one connection over its message-level `session`: call order
    as `Session`'s, with `request()`/`batch()` and `on_frame()` after the handshake."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._next_id = 1

    def next_id(self) -> int:
        """A new request id."""
        i = self._next_id
        self._next_id += 1
        return i

    def request(self, method: str, params: object, call_id: int | None) -> Outgoing:
        """A call (or, with `call_id=None`, a notification) as frames to write."""
        tensors: TensorRefs = []
        return self.session.message(
            request_json(method, params, call_id, tensors), tensors
        )

    def batch(self, calls: list[tuple[str, object, int]]) -> Outgoing:
        """Several calls in one message (tensor references numbered across them)."""
        tensors: TensorRefs = []
        reqs = [request_json(m, p, i, tensors) for m, p, i in calls]
        return self.session.message("[" + ",".join(reqs) + "]", tensors)

    def on_frame(self, f: Frame) -> list[tuple[object, Outcome]]:
        """A frame after the handshake -> the responses it carries, as (id, outcome).

        Raises as `Session.receive` does (`ConnectionClosed` for CLOSE, `ProtocolError`
        for anything the protocol does not allow), and `ProtocolError` for a message
        that is not JSON-RPC responses.
        """
        got = self.session.receive(f)
        if got is None:
            return []  # (a control frame, applied)
        try:
            return responses(got[0], got[1], f.refs)
        except PEER_FAULTS as e:
            # Anything the checks did not foresee is still the peer's fault, never a crash.
            raise ProtocolError(f"malformed frame: {e!r:.300}") from None


_METHODS: dict[str, str] = {}
"""`'{"jsonrpc":"2.0","method":"NAME"'` for each method name called so far (up to
`_MAX_METHODS` of them)."""
_MAX_METHODS = 4096


def request_json(
    method: str,
    params: object,
    call_id: int | None,
    tensors: TensorRefs,
) -> str:
    """One JSON-RPC request (tensors in `params` become references into `tensors`)."""
    try:
        text = _METHODS.get(method) if type(method) is str else None
        if text is None:
            text = '{"jsonrpc":"2.0","method":' + ENCODER.encode(method)
            if type(method) is str and len(_METHODS) < _MAX_METHODS:
                _METHODS[method] = text
        if params is not None:
            text += ',"params":' + params_json(params, tensors)
    except ValueError as e:  # NaN or infinity
        raise ParamsError(
            f"params hold a NaN or infinite float, which JSON cannot carry ({e}): send "
            "such values inside a numpy array, which travels as a tensor"
        ) from None
    if call_id is not None:
        text += ',"id":%d' % call_id
    return text + "}"


class _Slow(Exception):
    """`_fast_json` met something it leaves to `encode_params` and the JSON encoder."""


_FAST_DEPTH = 32
_FAST_ITEMS = 64
_encode_str: Callable[[str], str] = json.encoder.encode_basestring
_int_repr = int.__repr__
_float_repr = float.__repr__
_INF = float("inf")


def params_json(params: object, tensors: TensorRefs) -> str:
    """`params` as compact JSON text, numpy arrays and `Tensor`s replaced by
    `{"$tensor": i}` (appended to `tensors`): `ENCODER.encode(encode_params(..))`, with
    the same text and the same errors.

    Small params of the built-in JSON types and arrays (nearly all calls) are written in
    one pass; anything else (NaN, non-string keys, subclasses, numpy scalars, deep or long
    containers) goes the general way, from the start."""
    start = len(tensors)
    try:
        return _fast_json(params, tensors, 0)
    except _Slow:
        del tensors[start:]
        return ENCODER.encode(encode_params(params, tensors))


def _fast_json(v: object, tensors: TensorRefs, depth: int) -> str:
    t = type(v)
    if t is str:
        assert isinstance(v, str)
        return _encode_str(v)
    if t is dict:
        assert isinstance(v, dict)
        if not v:
            return "{}"
        if depth >= _FAST_DEPTH or len(v) > _FAST_ITEMS:
            raise _Slow
        items = []
        for k, x in v.items():
            if type(k) is not str:
                raise _Slow
            items.append(_encode_str(k) + ":" + _fast_json(x, tensors, depth + 1))
        return "{" + ",".join(items) + "}"
    if t is np.ndarray:
        assert isinstance(v, np.ndarray)
        tensors.append((little_endian(v), ferry_dtype(v.dtype)))
        return '{"$tensor":%d}' % (len(tensors) - 1)
    if t is int:
        return _int_repr(v)
    if t is float:
        if v != v or v == _INF or v == -_INF:
            raise _Slow  # the general way raises the encoder's own ValueError
        return _float_repr(v)
    if t is list or t is tuple:
        assert isinstance(v, (list, tuple))
        if not v:
            return "[]"
        if depth >= _FAST_DEPTH or len(v) > _FAST_ITEMS:
            raise _Slow
        return "[" + ",".join([_fast_json(x, tensors, depth + 1) for x in v]) + "]"
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if t is Tensor:
        assert isinstance(v, Tensor)
        tensors.append((little_endian(v.array), v.dtype))
        return '{"$tensor":%d}' % (len(tensors) - 1)
    raise _Slow


class _Unsendable(Exception):
    """A value `encode_params` cannot send; `path` collects where it is, innermost first."""

    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value
        self.path: list[str] = []


def encode_params(value: object, tensors: TensorRefs) -> object:
    """`value` as JSON, numpy arrays and `Tensor`s replaced by `{"$tensor": i}` (appended
    to `tensors` with their ferry dtype). Raises `ParamsError` naming where in the params a
    value that cannot be sent is, its type, and what can be sent instead."""
    try:
        return _encode(value, tensors, 0)
    except _Unsendable as e:
        where = "params" + "".join(reversed(e.path))
        t = type(e.value)
        name = (
            t.__qualname__
            if t.__module__ == "builtins"
            else f"{t.__module__}.{t.__qualname__}"
        )
        raise ParamsError(
            f"{where} is of type {name} ({e.value!r:.60}), which ferry cannot send: pass "
            "JSON values (None, bool, int, float, str, lists, tuples, dicts with str keys), "
            "numpy arrays, CUDA arrays (CuPy, torch), ferry_client.Tensor or TensorRef; "
            "convert it to one of those first"
        ) from None


def _encode(value: object, tensors: TensorRefs, depth: int) -> object:
    if depth > MAX_PARAM_DEPTH:
        raise ParamsError(f"params nested deeper than {MAX_PARAM_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Tensor):
        tensors.append((little_endian(value.array), value.dtype))
        return {"$tensor": len(tensors) - 1}
    if isinstance(value, np.ndarray):
        tensors.append((little_endian(value), ferry_dtype(value.dtype)))
        return {"$tensor": len(tensors) - 1}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, TensorRef):
        return value.to_json()
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ParamsError(
                    f"object keys must be strings, got {k!r} ({type(k).__qualname__}): "
                    "JSON objects have string keys; convert the key with str()"
                )
            try:
                out[k] = _encode(v, tensors, depth + 1)
            except _Unsendable as e:
                e.path.append(f"[{k!r}]")
                raise
        return out
    if isinstance(value, (list, tuple)):
        items = []
        for i, v in enumerate(value):
            try:
                items.append(_encode(v, tensors, depth + 1))
            except _Unsendable as e:
                e.path.append(f"[{i}]")
                raise
        return items
    cu = cuda_array(value)
    if cu is not None:
        tensors.append((cu, dtype_of(cu)))
        return {"$tensor": len(tensors) - 1}
    raise _Unsendable(value)


def _is_ref(v: object) -> bool:
    """`{"$tensor": i}` (an index) or `{"$tensor": {"dtype", "shape", "data", ..}}` (inline).

    Only those two shapes are tensors; other objects whose only key is `$tensor` (an
    OpenRPC document describing the tensor schema has one) are left as they are.
    """
    if type(v) is not dict or len(v) != 1:
        return False
    if REF_KEY in v:  # a remote tensor reference (PROTOCOL.md section 21)
        inner = v[REF_KEY]
        return type(inner) is dict and type(inner.get("id")) is str
    if "$tensor" not in v:
        return False
    inner = v["$tensor"]
    if type(inner) is int:
        return True
    return (
        type(inner) is dict
        and "dtype" in inner
        and "shape" in inner
        and "data" in inner
    )


def inline_tensor(value: dict[str, Any]) -> npt.NDArray[Any]:
    """The inline form `{"dtype", "shape", "strides"?, "data": base64}` as an array."""
    name = value.get("dtype")
    if not isinstance(name, str) or name not in NUMPY_DTYPES:
        raise ResultError(f"inline tensor of unknown dtype {name!r}")
    dtype = NUMPY_DTYPES[name]
    data = value.get("data")
    if not isinstance(data, str):
        raise ResultError("inline tensor without base64 `data`")
    try:
        raw = base64.b64decode(data, validate=True)
        span, strided = byte_span(value, dtype.itemsize)
    except (binascii.Error, ValueError, ProtocolError) as e:
        raise ResultError(f"malformed inline tensor: {e}") from None
    if span > len(raw) or (not strided and span != len(raw)):
        raise ResultError(f"inline tensor needs {span} bytes but has {len(raw)}")
    return typed_view(np.frombuffer(raw, dtype=np.uint8), dtype, value, span, strided)


def _resolve_ref(ref: dict[str, Any], arrays: list[npt.NDArray[Any]]) -> Any:
    """The array a `{"$tensor": ...}` value stands for, or the `TensorRef` a
    `{"$tensor_ref": ...}` one does (see `resolve_tensors`)."""
    if REF_KEY in ref:
        return TensorRef.from_json(ref[REF_KEY])
    i = ref["$tensor"]
    if type(i) is dict:
        return inline_tensor(i)
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(arrays):
        raise ResultError(
            f"tensor reference {ref!r} does not name one of the message's {len(arrays)} tensors"
        )
    return arrays[i]


def resolve_tensors(
    value: object, arrays: list[npt.NDArray[Any]], budget: list[int] | None = None
) -> object:
    """Replaces every tensor in `value` (parsed JSON, changed in place): `{"$tensor": i}`
    by `arrays[i]`, the inline form by its array. Raises `ResultError` for an index the
    message does not have or a malformed inline tensor.

    `budget`, when given, holds how many tensor objects are left at most (`[n]`, from
    `_wire.tensor_keys`; -1 for unknown): the walk stops once it has replaced that many,
    and takes them off. The walk is breadth-first, so tensors near the top of a result
    (a tensor store's buckets) are found before a large structure beside them (its
    manifest) is entered.
    """
    left = -1 if budget is None else budget[0]
    if left == 0 or not isinstance(value, (dict, list)):
        return value  # no tensor in it
    if _is_ref(value):
        assert isinstance(value, dict)
        if budget is not None and left > 0:
            budget[0] = left - 1
        return _resolve_ref(value, arrays)
    queue: list[object] = [value]
    at = 0
    while at < len(queue) and left != 0:
        v = queue[at]
        at += 1
        if type(v) is dict:
            for k, x in v.items():
                t = type(x)
                if t is dict:
                    if _is_ref(x):
                        v[k] = _resolve_ref(x, arrays)
                        left -= 1
                    else:
                        queue.append(x)
                elif t is list:
                    queue.append(x)
        else:
            assert type(v) is list
            for i, x in enumerate(v):
                t = type(x)
                if t is dict:
                    if _is_ref(x):
                        v[i] = _resolve_ref(x, arrays)
                        left -= 1
                    else:
                        queue.append(x)
                elif t is list:
                    queue.append(x)
    if budget is not None and budget[0] > 0:
        budget[0] = max(left, 0)
    return value


def responses(
    app: object, arrays: list[npt.NDArray[Any]], refs: int = -1
) -> list[tuple[object, Outcome]]:
    """The JSON-RPC responses in a message: (id, result or error) for each. `refs`: at most
    this many tensor objects in `app` (-1: unknown), see `resolve_tensors`."""
    items = app if isinstance(app, list) else [app]
    budget = [refs]
    out: list[tuple[object, Outcome]] = []
    for r in items:
        if not isinstance(r, dict) or "id" not in r:
            raise ProtocolError(f"not a JSON-RPC response: {r!r:.200}")
        rid = r["id"]
        if "error" in r:
            e = r["error"]
            if (
                not isinstance(e, dict)
                or isinstance(e.get("code"), bool)
                or not isinstance(e.get("code"), int)
            ):
                raise ProtocolError(f"malformed JSON-RPC error object: {e!r:.200}")
            message = e.get("message")
            out.append(
                (
                    rid,
                    error_from_code(
                        e["code"],
                        message if isinstance(message, str) else str(message),
                        e.get("data"),
                    ),
                )
            )
        elif "result" in r:
            try:
                out.append((rid, resolve_tensors(r["result"], arrays, budget)))
            except ResultError as err:
                out.append((rid, err))
        else:
            raise ProtocolError(
                f"a JSON-RPC response needs `result` or `error`: {r!r:.200}"
            )
    return out


def status_answer(r: object) -> dict[str, Any]:
    """A `ferry.task.status` (or `.cancel`) answer, checked: an object with a state."""
    if not isinstance(r, dict) or not isinstance(r.get("state"), str):
        raise ProtocolError(
            f"a task status must be an object with a state, got {r!r:.200}"
        )
    return r


def submit_params(
    method: str, params: object, keep: bool, detached: bool
) -> dict[str, object]:
    """The params of `ferry.task.submit`."""
    args: dict[str, object] = {"method": method, "keep": keep}
    if detached:
        args["detached"] = True
    if params is not None:
        args["params"] = params
    return args


def submit_answer(r: object) -> str:
    """A `ferry.task.submit` answer, checked -> the task's id."""
    if not isinstance(r, dict) or not isinstance(r.get("task"), str):
        raise ProtocolError(f"ferry.task.submit answered {r!r:.200}")
    return str(r["task"])


def discover_answer(r: object) -> dict[str, Any]:
    """An `rpc.discover` answer, checked: an object (the OpenRPC document)."""
    if not isinstance(r, dict):
        raise ProtocolError(f"rpc.discover answered {type(r).__name__}, not an object")
    return r
