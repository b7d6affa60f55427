"""Remote tensor references (PROTOCOL.md section 21): tensors that stay on the server.

A server method may answer with a reference instead of a tensor's bytes; the client gets
a `TensorRef` (its id, dtype, shape, device, size, expiry). Passed back as a param, where
the method takes a tensor, it moves no byte: the server uses the tensor it kept.

    r = client.call("make_embedding", {"text": "..."})   # a TensorRef
    client.call("search", {"query": r})                   # the server's tensor, no copy
    arr = fetch(client, r)                                # the bytes, when wanted
    free(client, r)

`keep(client, array)` makes a reference of a tensor of one's own (sent once, then passed
by reference). References belong to the caller's identity, die with the connection that
made them unless `publish`ed, and may carry a TTL.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ResultError

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["TensorRef", "fetch", "free", "keep", "list_refs", "publish"]

REF_KEY = "$tensor_ref"
SCHEMA_MARK = "x-ferry-tensor-ref"
"""What a `TensorRef` field's JSON Schema is under pydantic (a server replaces it with a
reference to its `TensorRef` component; pydantic would resolve a `$ref` given here among
its own definitions)."""


@dataclass(frozen=True)
class TensorRef:
    """A tensor kept on the server. Only `id` matters when it is passed back."""

    id: str
    dtype: str
    shape: tuple[int, ...]
    device: str = "cpu"
    nbytes: int = 0
    expires_ms: int | None = None
    """When it expires (milliseconds since the Unix epoch), or None."""
    published: bool = False
    """Whether it outlives the connection that made it."""

    @staticmethod
    def from_json(inner: object) -> TensorRef:
        """The inside of `{"$tensor_ref": {...}}`; `ResultError` when malformed."""
        if not isinstance(inner, dict) or not isinstance(inner.get("id"), str):
            raise ResultError(f"malformed tensor reference {inner!r:.100}")
        shape = inner.get("shape", [])
        expires = inner.get("expires_ms")
        if not isinstance(shape, list) or not all(type(d) is int for d in shape):
            raise ResultError(f"tensor reference with a bad shape {shape!r:.100}")
        if expires is not None and type(expires) is not int:
            raise ResultError(f"tensor reference with a bad expires_ms {expires!r:.40}")
        return TensorRef(
            id=inner["id"],
            dtype=str(inner.get("dtype", "")),
            shape=tuple(shape),
            device=str(inner.get("device", "cpu")),
            nbytes=int(inner.get("bytes", 0)),
            expires_ms=expires,
            published=bool(inner.get("published", False)),
        )

    def to_json(self) -> dict[str, object]:
        """The param form: `{"$tensor_ref": {"id": ID}}`."""
        return {REF_KEY: {"id": self.id}}

    @classmethod
    def __get_pydantic_core_schema__(cls, source: object, handler: object) -> Any:
        """As a pydantic field (pydantic is not a dependency: only pydantic calls this):
        a `TensorRef`, or its wire form, validates; it serializes to its wire form."""
        core_schema = importlib.import_module("pydantic_core.core_schema")

        def validate(v: object) -> TensorRef:
            if isinstance(v, TensorRef):
                return v
            if isinstance(v, dict) and len(v) == 1 and REF_KEY in v:
                return TensorRef.from_json(v[REF_KEY])
            raise ValueError('expected a tensor reference ({"$tensor_ref": {...}})')

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                TensorRef.to_result_json
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: object, handler: object) -> dict[str, Any]:
        """The mark a ferry server turns into its `TensorRef` component."""
        return {SCHEMA_MARK: True}

    def to_result_json(self) -> dict[str, object]:
        """The form a server answers with (every field, PROTOCOL.md section 21)."""
        return {
            REF_KEY: {
                "id": self.id,
                "dtype": self.dtype,
                "shape": list(self.shape),
                "device": self.device,
                "bytes": self.nbytes,
                "expires_ms": self.expires_ms,
                "published": self.published,
            }
        }


def _ref(result: object, method: str) -> TensorRef:
    if not isinstance(result, TensorRef):
        raise ResultError(f"{method} answered {result!r:.100}, not a tensor reference")
    return result


def keep(client: Client, tensor: object, *, ttl: float | None = None) -> TensorRef:
    """Sends `tensor` (a numpy array, or anything `call` sends) once and keeps it on the
    server; `ttl` in seconds frees it after that long."""
    params: dict[str, object] = {"tensor": tensor}
    if ttl is not None:
        params["ttl_ms"] = max(0, round(ttl * 1000))
    return _ref(client.call("ferry.ref.keep", params), "ferry.ref.keep")


def fetch(client: Client, ref: TensorRef) -> Any:
    """The tensor `ref` names (a read-only view of the server's memory over shm)."""
    return client.call("ferry.ref.fetch", {"ref": ref})


def free(client: Client, *refs: TensorRef) -> int:
    """Frees `refs`; how many were the caller's and still held."""
    r = client.call("ferry.ref.free", {"ids": [x.id for x in refs]})
    if not isinstance(r, dict) or type(r.get("freed")) is not int:
        raise ResultError(f"ferry.ref.free answered {r!r:.100}")
    return int(r["freed"])


def publish(client: Client, ref: TensorRef) -> TensorRef:
    """Lets `ref` outlive this connection (until freed or expired)."""
    return _ref(client.call("ferry.ref.publish", {"id": ref.id}), "ferry.ref.publish")


def list_refs(client: Client) -> list[TensorRef]:
    """The caller's references on the server."""
    r = client.call("ferry.ref.list", {})
    if not isinstance(r, list):
        raise ResultError(f"ferry.ref.list answered {r!r:.100}")
    return [_ref(x, "ferry.ref.list") for x in r]
