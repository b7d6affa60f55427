"""Bundles from a ferry tensor store (`ferry serve-weights`, or any server that mounts
`ferry_store::rpc::methods`): PROTOCOL.md section 20.

`open_bundle(client, name)` calls `store.open` and slices the version's buckets by its
manifest. Over the shm channel each bucket arrives as a read-only view of the server's
memory (no copy), so opening costs one mapping per bucket (512 MiB each by default),
whatever the number of tensors; every array is a view of a bucket and keeps it (and so the
version) alive until the last one is garbage-collected. The manifest arrives in columns
and each tensor's view is made on its first lookup, so opening a 1,000-tensor version costs
about 1.7 times opening a one-tensor one (`bench/store.py`).

Arrays are read-only; torch tensors (`as_torch=True`) are writable copy-on-write views
(see `_to_torch` for what a write is seen by). Every call goes through the native client
(`ferry.Client`), so the store may be at any address it reaches: `unix:NAME`,
`unix:/path.sock`, or `quic://host:port#sha256=PIN` with `token=` (over QUIC the buckets
arrive as copies, not mappings).

A GPU bundle (buckets in device memory, published with `Store::publish_device`) is not
sliced into tensors from Python yet: its buckets arrive over cuda-ipc as
`ferry.DeviceTensor`s, and looking up a tensor in one raises `ResultError` saying so.

    from ferry import open_weights
    sd = open_weights("unix:ferry-weights", "llama", as_torch=True)
    model.load_state_dict(sd, assign=True)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _native, _tensors
from ._client import Client
from .errors import ResultError
from .tensors import NUMPY_DTYPES

__all__ = ["Bundle", "open_bundle", "open_weights", "publish"]


class Bundle(Mapping[str, Any]):
    """One version of a bundle: its tensors by name (read-only numpy arrays, or torch
    tensors), in the order published, and what the store says
    of it.

    Opening costs one mapping per bucket; each tensor's view of its bucket is made the
    first time it is looked up (and kept), so a reader that takes ten tensors of a
    100,000-tensor bundle pays for ten. A manifest entry that does not fit its bucket is a
    `ResultError` when that tensor is looked up (`state_dict()` looks them all up).
    """

    def __init__(
        self,
        name: str,
        version: int,
        digest: str | None,
        metadata: object,
        nbytes: int,
        manifest: _Manifest,
        buckets: list[Any],
        as_torch: bool,
    ) -> None:
        self.name = name
        self.version = version
        self.digest = digest
        """`blake3:HEX`, or None while the store still computes it (pass `expect_digest`
        to wait for it and have it checked)."""
        self.metadata = metadata
        self.nbytes = nbytes
        """Bytes of the version's buckets."""
        self._manifest = manifest
        self._entries = manifest.index
        self._buckets = buckets
        self._views: dict[str, Any] = {}
        self._torch: Any = None
        if as_torch:
            import torch  # (optional)

            self._torch = torch
            for b in buckets:  # torch views may be written: copy-on-write, see `_to_torch`
                ref = _bucket_ref(b)
                if ref is not None:
                    ref._mark_writable()
        self._client: Client | None = None
        """The connection `open_weights` made: closed with the bundle."""

    def __getitem__(self, key: str) -> Any:
        v = self._views.get(key)
        if v is None:
            v = self._view(self._entries[key])
            self._views[key] = v
        return v

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __repr__(self) -> str:
        return (
            f"Bundle({self.name!r}, version={self.version}, tensors={len(self)}, "
            f"nbytes={self.nbytes})"
        )

    @property
    def tensors(self) -> dict[str, Any]:
        """Every tensor by name (a new dict; see `state_dict`)."""
        return self.state_dict()

    def state_dict(self) -> dict[str, Any]:
        """The tensors as a plain dict (what `load_state_dict` takes)."""
        return {k: self[k] for k in self._entries}

    def close(self) -> None:
        """Closes the connection `open_weights` made (the arrays stay valid)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _view(self, i: int) -> Any:
        m = self._manifest
        rows, dims, starts, dtypes = m.rows()
        name, dtype_name = m.names[i], dtypes[i]
        try:
            bucket, offset, ndim = rows[i]
            shape = tuple(dims[starts[i] : starts[i] + ndim])
            dtype = NUMPY_DTYPES[dtype_name]
            buf = self._buckets[bucket]
            if isinstance(buf, _native.DeviceTensor):
                raise ResultError(
                    f"tensor {name!r:.100} is in a {buf.device} bucket (a GPU bundle): the "
                    "bucket arrived over cuda-ipc as a ferry.DeviceTensor, but ferry.Bundle "
                    "slices host buckets only (torch.as_tensor(bucket, device='cuda') views it)"
                )
            n = math.prod(shape) * dtype.itemsize
            if offset + n > buf.shape[0]:
                raise ResultError(f"tensor {name!r} lies outside bucket {bucket}")
            arr: npt.NDArray[Any] = buf[offset : offset + n].view(dtype).reshape(shape)
        except (ValueError, TypeError, KeyError, IndexError) as err:
            raise ResultError(f"bad manifest entry for {name!r:.100}: {err}") from None
        if self._torch is not None:
            return _to_torch(self._torch, arr, dtype_name)
        return arr


class _Manifest:
    """`store.open`'s manifest in columns (PROTOCOL.md section 20): names and dtypes one
    per line, and two u64 tensors, turned into rows on the first lookup (opening costs a
    split of the names, not a parse per tensor)."""

    def __init__(self, m: object) -> None:
        if not isinstance(m, dict):
            raise ResultError(f"store.open's manifest is {m!r:.100}")
        names, dtypes, table, dims = (
            m.get("names"),
            m.get("dtypes"),
            m.get("table"),
            m.get("dims"),
        )
        for t, dt in (
            (names, np.uint8),
            (dtypes, np.uint8),
            (table, np.uint64),
            (dims, np.uint64),
        ):
            if not isinstance(t, np.ndarray) or t.dtype != dt:
                raise ResultError("store.open's manifest columns are not u8 text and u64")
        assert isinstance(names, np.ndarray) and isinstance(dtypes, np.ndarray)
        assert isinstance(table, np.ndarray) and isinstance(dims, np.ndarray)
        n = table.shape[0] if table.ndim == 2 and table.shape[1] == 3 else -1
        try:
            self.names = names.tobytes().decode().split("\n") if n > 0 else []
        except UnicodeDecodeError:
            raise ResultError("store.open's manifest names are not UTF-8") from None
        if n < 0 or len(self.names) != n or dims.ndim != 1:
            raise ResultError("store.open's manifest columns do not add up")
        self.index = dict(zip(self.names, range(n), strict=False))
        if len(self.index) != n:
            raise ResultError("store.open's manifest repeats a name")
        self._columns = (dtypes.tobytes(), table, dims)
        self._rows: tuple[list[list[int]], list[int], list[int], list[str]] | None = None

    def rows(self) -> tuple[list[list[int]], list[int], list[int], list[str]]:
        """(bucket, offset, ndim) per tensor, every dim, where each tensor's dims start,
        and the dtypes: made once, checked to add up."""
        if self._rows is None:
            dtypes, table, dims = self._columns
            rows: list[list[int]] = table.tolist()
            flat: list[int] = dims.tolist()
            starts, at = [], 0
            for r in rows:
                starts.append(at)
                at += r[2]
            names = dtypes.decode(errors="replace").split("\n") if rows else []
            if at != len(flat) or len(names) != len(rows):
                raise ResultError("store.open's manifest dims or dtypes do not add up")
            self._rows = (rows, flat, starts, names)
        return self._rows


def _bundle(result: object, as_torch: bool) -> Bundle:
    if not isinstance(result, dict):
        raise ResultError(f"store.open answered {result!r:.100}")
    buckets = result.get("buckets")
    if not isinstance(buckets, list):
        raise ResultError("store.open's answer lacks its buckets")
    for i, b in enumerate(buckets):
        if not isinstance(b, np.ndarray):
            raise ResultError(f"bucket {i} is a {type(b).__name__}, not a u8 vector")
        if b.dtype != np.uint8 or b.ndim != 1:
            raise ResultError(
                f"bucket {i} is a {b.dtype} array of shape {b.shape}, not a u8 vector"
            )
    return Bundle(
        str(result.get("name")),
        int(result.get("version", 0)),
        result.get("digest"),
        result.get("metadata"),
        int(result.get("bytes", 0)),
        _Manifest(result.get("manifest")),
        buckets,
        as_torch,
    )


def _bucket_ref(b: object) -> _native.TensorRef | None:
    """The received tensor a bucket array views (its base chain), if any."""
    for _ in range(8):
        b = getattr(b, "base", None)
        if b is None or isinstance(b, _native.TensorRef):
            return b
    return None


def _to_torch(torch: Any, arr: npt.NDArray[Any], dtype_name: str) -> Any:
    """A torch tensor over `arr`'s memory (no copy). It is a view of the server's bucket,
    mapped copy-on-write: a write (an optimizer step) copies the page it touches and never
    reaches the server or other processes (the written pages are dropped with the bucket,
    before its memory goes back). The mapping is one per connection, though: a bundle
    opened twice on one `Client` shares it, and a write through one is seen by the other.
    Open a copy to train with its own connection (`open_weights` makes one per bundle) or
    `.clone()` it."""
    with warnings.catch_warnings():
        # torch warns that the array is read-only: the mapping underneath is copy-on-write.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return _tensors.torch_view(arr, dtype_name, torch.from_numpy)


def open_bundle(
    client: Client,
    name: str,
    version: int | None = None,
    *,
    expect_digest: str | None = None,
    as_torch: bool = False,
    timeout: float | None = None,
) -> Bundle:
    """Opens version `version` (default: the latest) of bundle `name` on `client`'s server.

    Args:
        expect_digest: refuse the version unless its digest is this (`blake3:HEX`); the
            server waits until the digest is computed.
        as_torch: torch tensors (zero-copy views) instead of numpy arrays.

    Raises:
        RpcError: code -32009 (NOT_FOUND) for an unknown bundle or a version no longer held;
            -32602 (INVALID_PARAMS, `data.path` `expect_digest`) for a digest mismatch.
    """
    params: dict[str, object] = {"name": name}
    if version is not None:
        params["version"] = version
    if expect_digest is not None:
        params["expect_digest"] = expect_digest
    return _bundle(client.call("store.open", params, timeout=timeout), as_torch)


def open_weights(
    addr: str,
    name: str,
    version: int | None = None,
    *,
    expect_digest: str | None = None,
    as_torch: bool = False,
    **connect: Any,
) -> Bundle:
    """Connects to the store at `addr` (`unix:NAME`, `unix:/path.sock`,
    `quic://host:port#sha256=PIN`) and opens bundle `name` (see `open_bundle`); `connect`
    are `Client.connect`'s options (`token=`, `connect_timeout=`, ...). The connection
    lives as long as the returned bundle (`Bundle.close` ends it sooner)."""
    client = Client.connect(addr, **connect)
    try:
        b = open_bundle(client, name, version, expect_digest=expect_digest, as_torch=as_torch)
    except BaseException:
        client.close()
        raise
    b._client = client
    return b


def publish(
    client: Client,
    name: str,
    tensors: Mapping[str, object],
    metadata: object = None,
    *,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Publishes `tensors` (numpy arrays, or anything `Client.call` sends) as the next
    version of bundle `name`; returns `{"name", "version", "bytes", "tensors"}`. Arrays made
    by `client.alloc` travel without a copy; the store copies them once into its buckets."""
    result = client.call(
        "store.publish",
        {"name": name, "tensors": dict(tensors), "metadata": metadata},
        timeout=timeout,
    )
    if not isinstance(result, dict):
        raise ResultError(f"store.publish answered {result!r:.100}")
    return result
