"""Weight sync: a trainer publishes each step's weights, engines follow them by deltas.

```python
import ferry.weights

# trainer
pub = ferry.weights.Publisher("quic://0.0.0.0:7000", "policy")  # or a StoreServer
pub.publish(model.state_dict(), version=step)

# each engine (any host)
sub = ferry.weights.subscribe("quic://trainer:7000#sha256=PIN", "policy", token=TOKEN)
sub.wait_for(step, timeout=60.0)
sub.apply_to(engine_model)  # in place: same storage, CUDA graphs stay valid
```

- The store (`ferry serve-weights`, `ferry.StoreServer`) keeps each version; a new one
  shares every unchanged tensor with the one before (`store.publish`; with
  `changed=[...]` the unchanged ones are not even sent: `base`, `Store::publish_delta`).
  A `Publisher` given the `StoreServer` itself publishes without a connection: the
  changed tensors are copied once, straight into the new version's buckets
  (`Store::builder_from`), which the store makes ready between publishes.
- `wait_for` is a long poll (`store.delta` with `wait_ms`): the store answers as the
  version is published, and computes each delta once for every subscriber at the same
  version (it keeps the version before: `delta_bases`).
- A subscriber holds a verified copy of one version and moves to the next by
  `store.delta` (PROTOCOL.md §23): per tensor nothing, its changed elements, or the whole
  tensor. Every digest is checked (Rust `ferry_store::replica::apply`) before anything is
  written; a failed update (`UpdateFailed`: the connection lost, a digest that does not
  match) leaves the copy, and every model, at the version held.
- `apply_to(model)` checks the model's names, shapes and dtypes against the version
  (`ModelMismatch`, naming the tensor) before writing any parameter, then writes the
  changed elements into the existing parameters and buffers (`index_copy_`/`copy_`: the
  same storage, on whatever device they live).
- Rust has the same operations: `ferry_store::Store::publish` / `publish_delta` and
  `store.publish` with `base`, `ferry_store::replica::{fetch, Replica, DeltaTarget,
  apply}`, `ferry_store::delta_serve` (the store's delta cache and per-connection counts,
  `store.delta.stats`).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from . import _native, rpc_errors
from ._client import Client
from ._store_server import StoreServer
from ._tensors import dtype_name, host_numpy, to_numpy, to_torch
from .errors import FerryError

__all__ = [
    "ModelMismatch",
    "Publisher",
    "Subscriber",
    "UpdateFailed",
    "WeightsError",
    "subscribe",
]


_LONG_POLL = 30.0
"""Seconds one `store.delta` call waits for a new version (`wait_for` asks again after)."""


class WeightsError(FerryError):
    """A weight-sync operation failed."""


class UpdateFailed(WeightsError):
    """Moving to a new version failed (the connection lost, the store gone, a digest that
    does not match); nothing was written: `version` is still the version held (its
    `__cause__` says why)."""

    def __init__(self, message: str, version: int | None) -> None:
        super().__init__(message)
        self.version = version


class ModelMismatch(WeightsError, ValueError):
    """A model's tensors do not match the version (a name missing or extra, a shape or a
    dtype that differs); nothing was written. `tensor` names the first one."""

    def __init__(self, message: str, tensor: str) -> None:
        super().__init__(message)
        self.tensor = tensor


def _version_of(metadata: Any, store_version: int) -> int:
    """A version's number as the publisher gave it (`publish(version=...)`), else the
    store's."""
    if isinstance(metadata, dict) and isinstance(metadata.get("version"), int):
        return int(metadata["version"])
    return store_version


class Publisher:
    """Publishes versions of bundle `name` into a store: `addr_or_store` is a store's
    address (`unix:…`, `quic://host:port#sha256=PIN`) or a `ferry.StoreServer` this
    process hosts."""

    def __init__(
        self,
        addr_or_store: str | StoreServer,
        name: str,
        *,
        token: str | None = None,
        connect_timeout: float | None = 10.0,
        timeout: float | None = None,
    ) -> None:
        self.name = name
        # A store this process hosts is published into directly (no connection).
        self._local = addr_or_store if isinstance(addr_or_store, StoreServer) else None
        self._client: Client | None = None
        if self._local is None:
            assert isinstance(addr_or_store, str)
            self._client = Client.connect(
                addr_or_store, token=token, connect_timeout=connect_timeout, timeout=timeout
            )
        self._store_version: int | None = None

    def publish(
        self,
        state_dict: Mapping[str, Any],
        version: int | None = None,
        *,
        changed: Iterable[str] | None = None,
        removed: Iterable[str] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> int:
        """Publishes `state_dict` (torch CPU tensors or numpy arrays; bf16, fp16, fp32,
        fp8, ...) as the bundle's next version, labelled `version` (the training step;
        subscribers' `wait_for` and `version` use it). With `changed` (the names of the
        tensors that changed since this publisher's last publish), only those are sent and
        the others are kept from that version without being read; otherwise every tensor
        is sent and the store keeps, without a second copy, those equal to the latest
        version's. Returns the store's version number. A publish that fails (or a publisher
        that dies) leaves the previous version the latest."""
        meta: dict[str, Any] = dict(metadata or {})
        if version is not None:
            meta["version"] = int(version)
        if self._local is not None:
            self._store_version = _publish_local(
                self._local, self.name, state_dict, meta, changed, removed, self._store_version
            )
            return self._store_version
        assert self._client is not None
        if changed is not None and self._store_version is not None:
            names = list(changed)
            tensors = {n: _contiguous(state_dict[n]) for n in names}
            params: dict[str, Any] = {
                "name": self.name,
                "tensors": tensors,
                "metadata": meta,
                "base": self._store_version,
                "removed": list(removed),
            }
        else:
            tensors = {n: _contiguous(t) for n, t in state_dict.items()}
            params = {"name": self.name, "tensors": tensors, "metadata": meta}
        r = self._client.call("store.publish", params)
        self._store_version = int(r["version"])
        return self._store_version

    def close(self) -> None:
        """Closes the connection (the versions stay in the store)."""
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _same_bytes(x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> bool:
    """Whether two byte vectors are equal, compared in growing chunks (a tensor that changed
    anywhere near its start costs a few KiB to tell)."""
    n = x.size
    if n != y.size:
        return False
    i, size = 0, 4096
    while i < n:
        j = min(n, i + size)
        if not np.array_equal(x[i:j], y[i:j]):
            return False
        i, size = j, min(size * 4, 1 << 22)
    return True


def _publish_local(
    server: StoreServer,
    name: str,
    state_dict: Mapping[str, Any],
    meta: dict[str, Any],
    changed: Iterable[str] | None,
    removed: Iterable[str],
    mine: int | None,
) -> int:
    """Publishes into a store this process hosts: each tensor equal to the latest
    version's (or, with `changed`, each tensor not named) is kept where it lies, the others
    are copied once into the new version's buckets. Returns the store's version number."""
    latest = server._latest(name)
    base = None if latest is None else latest[0]
    prev = {} if latest is None else dict(latest[1])
    if changed is not None and mine is not None:
        if latest is None or mine != base:
            raise WeightsError(
                f"bundle {name!r}: version {mine} (this publisher's last) is no longer the"
                f" latest ({base} is): publish the whole state_dict, without changed="
            )
        ch, gone = set(changed), set(removed)
        names = [n for n, _ in latest[1] if n not in gone]
        names += sorted(n for n in ch if n not in prev)
        plan = [(n, n not in ch) for n in names]
    else:
        plan = []
        for n, t in state_dict.items():
            r = prev.get(n)
            keep = False
            if r is not None:
                a, dt = host_numpy(_contiguous(t))
                keep = (
                    dt == r.dtype
                    and tuple(a.shape) == tuple(r.shape)
                    and _same_bytes(
                        a.reshape(-1).view(np.uint8), np.asarray(r).reshape(-1).view(np.uint8)
                    )
                )
            plan.append((n, keep))
    specs: list[tuple[str, str, list[int], bool]] = []
    sources: list[np.ndarray[Any, Any] | None] = []
    for n, keep in plan:
        if keep:
            r = prev[n]
            specs.append((n, r.dtype, [int(x) for x in r.shape], True))
            sources.append(None)
        else:
            a, dt = host_numpy(_contiguous(state_dict[n]))
            specs.append((n, dt, [int(x) for x in a.shape], False))
            sources.append(a)
    b = server._build(name, base, specs)
    for i, src in enumerate(sources):
        slot = None if src is None else b.slot(i)
        if slot is None or src is None:
            continue
        dst: np.ndarray[Any, Any] = np.asarray(slot)
        np.copyto(dst, src.reshape(-1).view(np.uint8))
        del dst, slot
    return b.commit(json.dumps(meta))


def _contiguous(t: Any) -> Any:
    """`t` as a contiguous host tensor (torch or numpy)."""
    if hasattr(t, "is_contiguous") and hasattr(t, "detach"):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t if t.is_contiguous() else t.contiguous()
    return np.ascontiguousarray(t)


class Subscriber:
    """Follows bundle `name` of a store (`subscribe`)."""

    def __init__(self, native: _native.WeightsSubscriber) -> None:
        self._n = native
        # The version (store number, tree digest) each model was last brought to.
        self._models: weakref.WeakKeyDictionary[Any, tuple[int, str]] = weakref.WeakKeyDictionary()
        # Models that cannot be weakly referenced (a dict of tensors), by id, with the
        # addresses of their tensors (an id reused by another dict does not match).
        self._plain: dict[int, tuple[tuple[tuple[str, int], ...], tuple[int, str]]] = {}
        self.last_update: dict[str, int] | None = None
        """What the last update did (`update`'s result), `None` before the first."""

    @property
    def store_version(self) -> int | None:
        """The store's number of the version held (`None`: none yet)."""
        return self._n.version

    @property
    def version(self) -> int | None:
        """The version held, as the publisher labelled it (`publish(version=...)`; else
        the store's number); `None`: none yet."""
        v = self._n.version
        return None if v is None else _version_of(self.metadata, v)

    @property
    def metadata(self) -> Any:
        """The held version's metadata (the publisher's, plus `version`)."""
        return json.loads(self._n.metadata)

    @property
    def closed(self) -> bool:
        """Whether the connection to the store is closed."""
        return self._n.closed

    def update(self, timeout: float | None = None) -> dict[str, int]:
        """Moves to the latest version now (if there is one), all or nothing; returns what
        was done (`version`, `same`, `sparse`, `dense`, `elements`, `sent_bytes`,
        `full_bytes`). Raises `UpdateFailed` (the version held unchanged)."""
        return self._update(None, timeout)

    def _update(self, to: int | None, timeout: float | None) -> dict[str, int]:
        held = self.version
        try:
            self.last_update = dict(self._n.update(to, timeout))
            return self.last_update
        except Exception as e:
            raise UpdateFailed(
                f"update of {self._n.name!r} failed, still at version {held}: {e}", held
            ) from e

    def wait_for(self, version: int, timeout: float | None = None) -> int:
        """Waits until the store's latest version is `version` or later (the publisher's
        label), then moves to it, all or nothing. Returns the version now held. Raises
        `TimeoutError` after `timeout` seconds (the version held unchanged) and
        `UpdateFailed` when the update fails. The store answers as the version is
        published (a long poll on `store.delta`), not when a poll comes round."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            have = self.version
            if have is not None and have >= version:
                return have
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"{self._n.addr}: version {version} of {self._n.name!r} not published"
                    f" within {timeout} s (holding {have})"
                )
            wait = _LONG_POLL if left is None else min(left, _LONG_POLL)
            try:
                self.last_update = dict(self._n.update(None, left, wait))
            except rpc_errors.NotFoundError:
                continue  # no version yet: the store waited `wait` for one
            except TimeoutError as e:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"{self._n.addr}: version {version} of {self._n.name!r} not in"
                        f" within {timeout} s (holding {have})"
                    ) from e
                raise UpdateFailed(f"waiting for version {version}: {e}", have) from e
            except Exception as e:
                raise UpdateFailed(f"waiting for version {version}: {e}", have) from e

    def state_dict(self, as_torch: bool = True) -> dict[str, Any]:
        """The version held, by name: views of the subscriber's verified copy (no copy
        made). They keep this version while held: a later update writes the next version
        into new memory for the tensors still viewed. Each call maps the copy anew,
        copy-on-write (Linux): a write into these tensors (torch has no read-only tensors)
        copies the pages it touches into this dict's tensors alone, never into the verified
        copy, another `state_dict` or a later version. For weights a model keeps and
        updates in place, use `apply_to`."""
        conv = to_torch if as_torch else to_numpy
        return {n: conv(r) for n, r in self._n.tensors()}

    def apply_to(self, model: Any) -> int:
        """Writes the version held into `model` (a `torch.nn.Module`, or a dict of tensors)
        in place: every parameter and buffer keeps its storage. Checks first that the model
        has exactly the version's tensors, with their shapes and dtypes (`ModelMismatch`,
        nothing written); a model brought to the version before by this subscriber gets
        only the changed elements, another gets every tensor. Returns the version."""
        import torch

        v, tree = self._n.version, self._n.tree
        if v is None or tree is None:
            raise WeightsError(
                f"{self._n.name!r}: no version held yet (call wait_for or update first)"
            )
        targets = _targets(model)
        refs = self._n.tensors()
        want = {n: (r.dtype, tuple(r.shape)) for n, r in refs}
        for n in targets:
            if n not in want:
                raise ModelMismatch(f"the model's tensor {n!r} is not in version {self.version}", n)
        for n, (dt, shape) in want.items():
            t = targets.get(n)
            if t is None:
                raise ModelMismatch(
                    f"tensor {n!r} of version {self.version} is not in the model", n
                )
            if tuple(t.shape) != shape:
                raise ModelMismatch(
                    f"tensor {n!r}: the model's shape is {tuple(t.shape)}, the version's {shape}", n
                )
            if dtype_name(t.dtype) != dt:
                raise ModelMismatch(
                    f"tensor {n!r}: the model's dtype is {t.dtype}, the version's {dt}", n
                )
        key = _weak_key(model)
        prints = tuple((n, int(t.data_ptr())) for n, t in targets.items())
        if key is not None:
            held = self._models.get(key)
        else:
            plain = self._plain.get(id(model))
            held = plain[1] if plain is not None and plain[0] == prints else None
        last = self._n.last_delta()
        with torch.no_grad():
            if held == (v, tree):
                pass
            elif (
                last is not None
                and last[0] is not None
                and held == (last[0], last[1])
                and last[2] == v
            ):
                for name, kind, index, values in last[3]:
                    t = targets[name]
                    vals = _as_dtype(to_torch(values), t.dtype).to(t.device, non_blocking=False)
                    if kind == "dense":
                        t.copy_(vals.view(t.shape))
                    else:
                        assert index is not None
                        idx = torch.from_numpy(to_numpy(index).astype(np.int64)).to(t.device)
                        t.view(-1).index_copy_(0, idx, vals)
            else:
                for n, r in refs:
                    t = targets[n]
                    t.copy_(_as_dtype(to_torch(r), t.dtype).view(t.shape))
        if key is not None:
            self._models[key] = (v, tree)
        else:
            self._plain[id(model)] = (prints, (v, tree))
            while len(self._plain) > 16:
                del self._plain[next(iter(self._plain))]
        return _version_of(self.metadata, v)

    def store_stats(self) -> list[dict[str, Any]]:
        """Delta bytes the store sent each connection (`store.delta.stats`)."""
        return list(self._n.store_stats())


def _as_dtype(t: Any, dtype: Any) -> Any:
    """`t` reinterpreted as `dtype` when the bits agree (float8 over uint8)."""
    return t if t.dtype == dtype else t.view(dtype)


def _weak_key(model: Any) -> Any:
    try:
        weakref.ref(model)
    except TypeError:
        return None
    return model


def _targets(model: Any) -> dict[str, Any]:
    """A model's parameters and buffers by name (`state_dict(keep_vars=True)`: the
    tensors themselves), or a dict of tensors as given."""
    if hasattr(model, "state_dict") and callable(model.state_dict):
        return dict(model.state_dict(keep_vars=True))
    if isinstance(model, Mapping):
        return dict(model)
    raise TypeError(
        f"apply_to takes a torch.nn.Module or a dict of tensors, not {type(model).__name__}"
    )


def subscribe(
    addr: str,
    name: str,
    *,
    token: str | None = None,
    connect_timeout: float | None = 10.0,
) -> Subscriber:
    """A subscriber to bundle `name` of the store at `addr` (`unix:…`,
    `quic://host:port#sha256=PIN`), holding nothing yet: `wait_for(version)` or `update()`
    brings a version."""
    return Subscriber(
        _native.WeightsSubscriber(addr, name, token=token, connect_timeout=connect_timeout)
    )
