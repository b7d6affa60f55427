"""`ferry.ray`: ferry as a Ray tensor transport (Ray Direct Transport, Ray >= 2.60).

```python
import ray, torch, ferry.ray

ferry.ray.register()  # before the actors are created, in the process that creates them

@ray.remote(enable_tensor_transport=True)
class Producer:
    @ray.method(tensor_transport="ferry")
    def produce(self):
        return torch.randn(1 << 20)

@ray.remote(enable_tensor_transport=True)
class Consumer:
    def consume(self, t):
        return float(t.sum())

a, b = Producer.remote(), Consumer.remote()
ray.get(b.consume.remote(a.produce.remote()))
```

How it moves tensors:

- Each actor that produces tensors hosts a small ferry endpoint (`_native.TensorHost`,
  started at its first produced object) on a unix socket and on QUIC (the node's IP, any
  port). It keeps each object's tensors by Ray's object id in ferry shared memory (memfds
  that belong to no connection): a tensor made by `ferry.ray.empty` is already there (no
  copy); any other is copied in once, into a segment of the host's pool: one that came
  back (its object garbage-collected and every consumer's tensor from it dropped) is filled
  again, its pages already there (a new segment's first touch of each page costs more than
  the copy). A segment a consumer may still read is never filled again (see `register`'s
  `pool_mib`).
- The metadata Ray carries to the consumer is a JSON descriptor (`FerryTransportMetadata
  .descriptor`: id, node, addresses, dtypes and shapes): no pickled handles.
- The consumer (`recv_multiple_tensors`, one-sided: the producer's Python never runs)
  connects to the producer's endpoint and asks for the id. On the same node it uses the
  unix socket: the tensors arrive as leases on the producer's memfds, mapped read-only
  (copy-on-write: torch has no read-only tensors, so a write stays in the consumer) with
  no copy. On another node, or with `force_remote=True`, it uses QUIC, pinned to the
  producer's certificate fingerprint, with the configured token.
- CUDA tensors stay where the producer made it (held, with the torch tensor, until
  garbage-collected): a consumer on the node gets a copy made on the device when it asks
  (cuda-ipc: into the channel's exportable pool, which it maps without a copy, so its
  writes reach no one else); a consumer on another node (or `force_remote=True`) gets
  their bytes copied to the host and sent over QUIC, and moves them to its current CUDA
  device (or keeps them on the cpu for target buffers there). The put waits for all of
  the device's work (`torch.cuda.synchronize`): torch keeps no record of which stream
  wrote a tensor.
- `garbage_collect` (Ray: the ObjectRef went out of scope) drops the producer's hold; the
  memory goes back to the pool when the last consumer view dies too, and the pool gives it
  back to the system after `pool_idle` seconds unused. A dead producer's memory is freed by
  the kernel (nothing is named in `/dev/shm`); a consumer asking a dead producer gets
  `ProducerGone` at once (the socket refuses), never Ray's 60 s fetch timeout.

Ray's alpha API forces some compromises, each documented where it is made: torch tensors
only (a transport has one data type, and registering `np.ndarray` would replace Ray's
numpy serializer in every process using it); the configuration travels with the
transport's class (Ray constructs managers without arguments).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _native, _tensors
from .errors import FerryError

try:
    from ray.experimental.rdt import (
        CommunicatorMetadata,
        TensorTransportManager,
        TensorTransportMetadata,
    )
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        'ferry.ray needs Ray >= 2.60 (Ray Direct Transport): pip install "ferry-tensors[ray]"'
    ) from e

__all__ = [
    "DEFAULT_FETCH_TIMEOUT",
    "DEFAULT_MAX_HOST_MIB",
    "DEFAULT_POOL_IDLE",
    "DEFAULT_POOL_MIB",
    "TRANSPORT",
    "FerryCommunicatorMetadata",
    "FerryTransport",
    "FerryTransportMetadata",
    "ObjectFreed",
    "ProducerGone",
    "TransferError",
    "TransportNotEnabled",
    "empty",
    "host_stats",
    "register",
]

TRANSPORT = "FERRY"
"""The transport's name as Ray keeps it (`tensor_transport="ferry"` in any case)."""

DEFAULT_MAX_HOST_MIB = 16384
"""The default of `register(max_host_mib=)`: the most tensor memory one actor holds for
objects not yet garbage-collected."""

DEFAULT_FETCH_TIMEOUT = 30.0
"""The default of `register(fetch_timeout=)`: seconds a consumer waits for a producer's
answer (a live producer answers from its Rust runtime, without its Python thread)."""

DEFAULT_POOL_MIB = 1024
"""The default of `register(pool_mib=)`: the most memory of idle segments one actor keeps to
copy the next objects into."""

DEFAULT_POOL_IDLE = 5.0
"""The default of `register(pool_idle=)`: seconds an idle kept segment waits before it goes
back to the system."""

_ALIGN = 64


class TransferError(FerryError):
    """A ferry transfer under Ray failed."""


class ProducerGone(TransferError, ConnectionError):
    """The producing actor's endpoint is gone (the actor died or was killed)."""


class ObjectFreed(TransferError, KeyError):
    """The producer no longer holds the object (it was garbage-collected)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TransportNotEnabled(TransferError, ValueError):
    """An actor takes part in a ferry transfer without `enable_tensor_transport=True`."""


@dataclass
class FerryCommunicatorMetadata(CommunicatorMetadata):
    """A one-sided fetch needs no pairing of the two actors; this only carries what the
    owner knows of the receiver (`dst_error`: why it cannot take part), for the receiver to
    raise (Ray may build it on a callback thread, where an exception would be lost)."""

    dst_error: str | None = None


@dataclass
class FerryTransportMetadata(TensorTransportMetadata):
    """Ray's fields (`tensor_meta`, `tensor_device`) plus ferry's JSON descriptor."""

    descriptor: str = "{}"


@dataclass(frozen=True)
class _Config:
    token: str | None = None
    force_remote: bool = False
    quic: bool = True
    max_host_mib: int = DEFAULT_MAX_HOST_MIB
    fetch_timeout: float = DEFAULT_FETCH_TIMEOUT
    pool_mib: int = DEFAULT_POOL_MIB
    pool_idle: float = DEFAULT_POOL_IDLE


# ---------------------------------------------------------------------------------------
# The producer's side: one host per process, blocks of ferry-allocated tensors.

_host_lock = threading.Lock()
_host: _native.TensorHost | None = None
_host_desc: dict[str, Any] = {}

_blocks: weakref.WeakValueDictionary[int, _native.SharedBlock] = weakref.WeakValueDictionary()
"""Blocks made by `empty`, by address: a tensor over one whole is put without a copy."""


def empty(shape: tuple[int, ...] | list[int], dtype: Any = None) -> Any:
    """A writable torch tensor in ferry shared memory: returned from a
    `tensor_transport="ferry"` method, it is lent to consumers with no copy at all. Do not
    write it once returned."""
    import torch

    dt = torch.float32 if dtype is None else dtype
    name = _tensors.dtype_name(dt)
    item = torch.empty((), dtype=dt).element_size()
    n = item
    for d in shape:
        n *= int(d)
    block = _native.SharedBlock(n)
    _blocks[block.data_ptr] = block
    raw: np.ndarray[Any, Any] = np.asarray(block)[:n]
    flat = torch.from_numpy(raw)  # keeps `block` alive through numpy's base
    view = flat.view(_torch_dtype(name)) if n else torch.empty(0, dtype=dt)
    return view.reshape([int(d) for d in shape])


def _torch_dtype(name: str) -> Any:
    import torch

    special = {"bf16": "bfloat16", "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}
    if name in special:
        return getattr(torch, special[name])
    return torch.from_numpy(np.empty(0, dtype=_np_dtype(name))).dtype


def _np_dtype(name: str) -> np.dtype[Any]:
    for n, typestr, _ in _native.dtypes():
        if n == name:
            return np.dtype(typestr)
    raise ValueError(f"unknown ferry dtype {name!r}")


_node_cache: tuple[str, str] | None = None


def _node() -> tuple[str, str]:
    """This process's Ray node id and IP (asked once: a worker never changes node)."""
    global _node_cache
    if _node_cache is None:
        import ray

        ctx = ray.get_runtime_context()
        ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        _node_cache = (str(ctx.get_node_id()), ip)
    return _node_cache


def _get_host(cfg: _Config) -> tuple[_native.TensorHost, dict[str, Any]]:
    global _host, _host_desc
    with _host_lock:
        if _host is None:
            node_id, ip = _node()
            addrs = [f"unix:ferry-ray-{os.getpid()}-{uuid.uuid4().hex[:12]}"]
            if cfg.quic:
                host = f"[{ip}]" if ":" in ip else ip
                addrs.append(f"quic://{host}:0")
            h = _native.TensorHost(
                addrs,
                token=cfg.token,
                max_bytes=max(1, cfg.max_host_mib) << 20,
                pool_bytes=max(0, cfg.pool_mib) << 20,
                pool_idle=cfg.pool_idle,
            )
            got = h.addresses
            _host_desc = {
                "node": node_id,
                "pid": os.getpid(),
                "unix": got[0],
                "quic": got[1] if len(got) > 1 else None,
            }
            _host = h
        return _host, _host_desc


_stats_lock = threading.Lock()
_stats = {
    "copied_bytes": 0,
    "fetched_unix": 0,
    "fetched_quic": 0,
    "put_ns": 0,
    "put_ns_last": 0,
    "fetch_ns": 0,
    "fetch_ns_last": 0,
    "fetched_to_device": 0,
}


def _count(key: str, n: int = 1) -> None:
    with _stats_lock:
        _stats[key] += n


def _timed(key: str, since_ns: int) -> None:
    """Adds the time since `since_ns` to `key` and sets `key_last` to it."""
    dt = time.perf_counter_ns() - since_ns
    with _stats_lock:
        _stats[key] += dt
        _stats[key + "_last"] = dt


def host_stats() -> dict[str, int]:
    """This process's figures: `objects` and `bytes` its host holds now, `copied_bytes`
    copied into shared memory so far (tensors not made by `empty`), `fetched_unix` /
    `fetched_quic`: objects this process fetched over each path; `put_ns` / `fetch_ns`: time
    spent putting objects on its host (Ray's metadata call: the copy in, if any) and fetching
    them (the consumer's whole receive), in all and (`put_ns_last`, `fetch_ns_last`) the last
    one; its pool's `pool_segments`
    and `pool_bytes` kept idle now, and `segments_created`, `segments_reused`,
    `segments_withheld` (a consumer might still read them: never refilled) and
    `segments_given_back` so far."""
    h = _host
    with _stats_lock:
        out = dict(_stats)
    out["objects"] = h.count if h is not None else 0
    copies = h.host_copies if h is not None else (0, 0)
    out["device_host_copies"], out["device_host_copy_bytes"] = copies
    out["bytes"] = h.nbytes if h is not None else 0
    p = h.pool_stats if h is not None else {}
    out["pool_segments"] = p.get("kept_segments", 0)
    out["pool_bytes"] = p.get("kept_bytes", 0)
    for k in ("created", "reused", "withheld", "given_back"):
        out[f"segments_{k}"] = p.get(k, 0)
    return out


def _whole_block(t: Any) -> _native.SharedBlock | None:
    """The `empty` block `t` is exactly (same address, same size), if any."""
    b = _blocks.get(t.data_ptr())
    if b is not None and b.nbytes == t.numel() * t.element_size() and t.is_contiguous():
        return b
    return None


def _put(cfg: _Config, obj_id: str, tensors: list[Any]) -> list[dict[str, Any]]:
    """Puts `tensors` on this process's host under `obj_id`; their descriptors."""
    host, _ = _get_host(cfg)
    devices = {str(t.device) for t in tensors}
    if len(devices) > 1:
        raise ValueError(
            "the ferry transport moves the tensors of one object from one device; this object "
            f"has tensors on {', '.join(sorted(devices))}: return them from separate methods, "
            "or move them to one device first"
        )
    if tensors and tensors[0].device.type == "cuda":
        return _put_device(host, obj_id, tensors)
    if tensors and tensors[0].device.type != "cpu":
        raise ValueError(
            f"the ferry transport moves cpu and cuda tensors; these are on {tensors[0].device}: "
            "move them with .cpu() first"
        )
    arrays = [_tensors.host_numpy(t) for t in tensors]
    shapes = [[int(n) for n in a.shape] for a, _ in arrays]
    descs: list[dict[str, Any]] = [
        {"dtype": d, "shape": s} for (_, d), s in zip(arrays, shapes, strict=True)
    ]
    if len(tensors) == 1:
        b = _whole_block(tensors[0])
        if b is not None:  # ferry-allocated: no copy
            host.put(obj_id, b, [(0, shapes[0], arrays[0][1])])
            return descs
    # Several tensors, or not ferry's: copied once, into one block of the host's pool (its
    # bytes may be an earlier object's: the gaps between tensors are zeroed, so a consumer
    # maps nothing but this object's bytes and zeros).
    layout: list[tuple[int, list[int], str]] = []
    off = 0
    for (a, d), s in zip(arrays, shapes, strict=True):
        layout.append((off, s, d))
        off += (a.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    block = host.block(off)
    raw: np.ndarray[Any, Any] = np.asarray(block)
    end = 0
    for (a, _), (o, _, _) in zip(arrays, layout, strict=True):
        raw[end:o] = 0
        dst = raw[o : o + a.nbytes].view(a.dtype).reshape(a.shape)
        np.copyto(dst, a, casting="no")
        end = o + a.nbytes
    raw[end:] = 0
    host.put(obj_id, block, layout)
    _count("copied_bytes", sum(a.nbytes for a, _ in arrays))
    return descs


def _put_device(host: _native.TensorHost, obj_id: str, tensors: list[Any]) -> list[dict[str, Any]]:
    """Puts CUDA `tensors` on the host, where they are: each consumer on this node gets a
    copy made on the device when it asks (cuda-ipc: a device-to-device copy into the
    channel's exportable pool, which the consumer maps), one on another node their bytes
    copied to the host (QUIC)."""
    import torch

    ts = [t.detach().contiguous() for t in tensors]
    # ferry copies on the device's legacy default stream, later, when a consumer asks; the
    # tensors may have been written on any stream (the method may have returned from a
    # `torch.cuda.stream(...)` block, which Ray's call here no longer sees), and torch keeps
    # no record of which: wait for all of the device's work.
    torch.cuda.synchronize(ts[0].device)
    dts = [_tensors.device_out(t, None) for t in ts]
    host.put_device(obj_id, dts)
    return [{"dtype": d.dtype, "shape": list(d.shape), "device": "cuda"} for d in dts]


# ---------------------------------------------------------------------------------------
# The consumer's side: one pipe per producer address.

_pipes_lock = threading.Lock()
_pipes: dict[str, tuple[_native.Pipe, threading.Lock]] = {}
_inflight: dict[str, _native.Pipe] = {}
_aborted: set[str] = set()


def _pipe(addr: str, cfg: _Config) -> tuple[_native.Pipe, threading.Lock]:
    with _pipes_lock:
        got = _pipes.get(addr)
        if got is not None and not got[0].closed:
            return got
    try:
        p = _native.connect(addr, token=cfg.token)
    except (ConnectionError, OSError) as e:
        raise ProducerGone(
            f"the producing actor's ferry endpoint {addr} does not answer ({e}): "
            "the actor died, was killed, or its node is unreachable"
        ) from None
    with _pipes_lock:
        _pipes[addr] = (p, threading.Lock())
        return _pipes[addr]


def _drop_pipe(addr: str) -> None:
    with _pipes_lock:
        got = _pipes.pop(addr, None)
    if got is not None:
        got[0].close()


def _fetch(cfg: _Config, obj_id: str, desc: dict[str, Any], to_device: bool = True) -> list[Any]:
    """The tensors of `obj_id`, from its producer. CUDA tensors: mapped from the producer's
    GPU over cuda-ipc (same node), or copied to this process's current CUDA device from
    the host copy another node sends (unless `to_device` is False: they stay on the cpu,
    for target buffers to take)."""
    node_id, _ = _node()
    remote = cfg.force_remote or desc.get("node") != node_id
    addr = desc.get("quic") if remote else desc.get("unix")
    if not addr:
        raise TransferError(
            f"object {obj_id}: its producer (pid {desc.get('pid')} on node {desc.get('node')}) "
            "has no QUIC address (register(quic=False)) and this consumer is on another node"
            + (" or force_remote=True" if cfg.force_remote else "")
        )
    p, lock = _pipe(addr, cfg)
    with lock:
        _inflight[obj_id] = p
        try:
            p.send(json.dumps({"get": obj_id}), [], cfg.fetch_timeout)
            m = p.recv(cfg.fetch_timeout)
        except TimeoutError:
            _drop_pipe(addr)
            raise TransferError(
                f"object {obj_id}: the producer at {addr} did not answer within "
                f"{cfg.fetch_timeout} s (register(fetch_timeout=...))"
            ) from None
        except (ConnectionError, OSError) as e:
            _drop_pipe(addr)
            if obj_id in _aborted:
                _aborted.discard(obj_id)
                raise TransferError(f"object {obj_id}: the transfer was aborted") from None
            raise ProducerGone(
                f"object {obj_id}: the producing actor's endpoint {addr} closed ({e}): "
                "the actor died or was killed"
            ) from None
        finally:
            _inflight.pop(obj_id, None)
    head = json.loads(m.header)
    if "ok" not in head:
        if "missing" in head:
            raise ObjectFreed(
                f"object {obj_id}: the producer no longer holds it (garbage-collected)"
            )
        raise TransferError(f"object {obj_id}: the producer answered {head!r}")
    want = desc.get("tensors", [])
    if len(m.tensors) != len(want):
        raise TransferError(
            f"object {obj_id}: {len(m.tensors)} tensors arrived, the descriptor names {len(want)}"
        )
    _count("fetched_quic" if remote else "fetched_unix")
    out = [_tensors.to_torch(r) for r in m.tensors]
    if head.get("host_copy") and to_device:
        out = _to_cuda(obj_id, out)
    return out


def _to_cuda(obj_id: str, tensors: list[Any]) -> list[Any]:
    """Host copies of CUDA tensors, moved to this process's current CUDA device."""
    import torch

    if not torch.cuda.is_available():
        raise TransferError(
            f"object {obj_id} holds CUDA tensors and this process cannot use CUDA (an actor "
            "without num_gpus?): fetch it onto the cpu with "
            "ray.experimental.set_target_device_for_ref(ref, 'cpu')"
        )
    dev = torch.device("cuda", torch.cuda.current_device())
    _count("fetched_to_device")
    return [t.to(dev) for t in tensors]


# ---------------------------------------------------------------------------------------
# The manager Ray calls.


class FerryTransport(TensorTransportManager):
    """Ray's `TensorTransportManager` for ferry (one-sided: the consumer fetches)."""

    _config: _Config = _Config()

    def tensor_transport_backend(self) -> str:
        return TRANSPORT

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        # An abort closes the consumer's pipe, which ends a fetch waiting on it: nothing is
        # left blocked on either side (the producer's Python never takes part).
        return True

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        # Ray asks about the *producing* actor; ferry needs nothing but tensor transport
        # being enabled (the endpoint starts with the first object).
        return bool(getattr(actor, "_ray_enable_tensor_transport", False))

    def extract_tensor_transport_metadata(
        self, obj_id: str, rdt_object: list[Any]
    ) -> FerryTransportMetadata:
        t0 = time.perf_counter_ns()
        cfg = self._config
        descs = _put(cfg, obj_id, list(rdt_object))
        _, where = _get_host(cfg)
        descriptor = json.dumps({"v": 1, "id": obj_id, **where, "tensors": descs})
        meta = FerryTransportMetadata(
            tensor_meta=[(t.shape, t.dtype) for t in rdt_object],
            tensor_device=rdt_object[0].device.type if rdt_object else None,
            descriptor=descriptor,
        )
        _timed("put_ns", t0)
        return meta

    def get_communicator_metadata(
        self, src_actor: Any, dst_actor: Any, backend: str | None = None
    ) -> FerryCommunicatorMetadata:
        if dst_actor is not None and not getattr(dst_actor, "_ray_enable_tensor_transport", True):
            return FerryCommunicatorMetadata(
                dst_error=f"{dst_actor} receives a ferry tensor (tensor_transport='ferry') but "
                "was declared without enable_tensor_transport=True: declare its class "
                "@ray.remote(enable_tensor_transport=True)"
            )
        return FerryCommunicatorMetadata()

    def recv_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> list[Any]:
        if not isinstance(tensor_transport_metadata, FerryTransportMetadata):
            raise TypeError(
                f"the ferry transport got {type(tensor_transport_metadata).__name__} metadata"
            )
        dst_error = getattr(communicator_metadata, "dst_error", None)
        if dst_error:
            raise TransportNotEnabled(dst_error)
        t0 = time.perf_counter_ns()
        desc = json.loads(tensor_transport_metadata.descriptor)
        if not desc.get("tensors"):
            return []
        tensors = _fetch(self._config, obj_id, desc, to_device=not target_buffers)
        if target_buffers:
            for dst, src in zip(target_buffers, tensors, strict=True):
                dst.copy_(src)
            tensors = list(target_buffers)
        _timed("fetch_ns", t0)
        return tensors

    def send_multiple_tensors(
        self,
        tensors: list[Any],
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
    ) -> None:
        raise NotImplementedError(
            "the ferry transport is one-sided: the consumer fetches, Ray never calls send"
        )

    def garbage_collect(
        self, obj_id: str, tensor_transport_meta: TensorTransportMetadata, tensors: list[Any]
    ) -> None:
        h = _host
        if h is not None:
            h.free(obj_id)

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        # On the consumer: closes the pipe an in-flight fetch of `obj_id` waits on (it then
        # raises TransferError, and the next fetch connects again); what it had received is
        # dropped with it. On the producer there is nothing to abort: it serves from Rust.
        p = _inflight.pop(obj_id, None)
        if p is not None:
            _aborted.add(obj_id)
            p.close()


_registered: type[FerryTransport] | None = None


def register(
    *,
    token: str | None = None,
    force_remote: bool = False,
    quic: bool = True,
    max_host_mib: int = DEFAULT_MAX_HOST_MIB,
    fetch_timeout: float = DEFAULT_FETCH_TIMEOUT,
    pool_mib: int = DEFAULT_POOL_MIB,
    pool_idle: float = DEFAULT_POOL_IDLE,
) -> type[FerryTransport]:
    """Registers the `ferry` tensor transport (`cpu` and `cuda`, torch tensors) with Ray. Call it in
    the process that creates the actors, before creating them (Ray then registers it on
    each actor declared with `enable_tensor_transport=True`).

    - `token`: the QUIC endpoints' token (consumers present it; default: none, or the
      `FERRY_RAY_TOKEN` environment variable).
    - `force_remote`: consumers fetch over QUIC even on the producer's node (tests, and
      measuring the cross-node path on one machine).
    - `quic`: producers listen on QUIC too (default); False keeps every transfer on one
      node.
    - `max_host_mib`: the most tensor memory an actor holds for live objects (default
      16384); past it the producing method fails naming this option.
    - `fetch_timeout`: seconds a consumer waits for a producer's answer (default 30).
    - `pool_mib`: the most memory of idle segments an actor keeps to copy its next objects
      into (default 1024; 0 keeps none). A tensor not made by `ferry.ray.empty` is copied
      into a kept segment of its size, in whole pages, when one came back: its object was
      garbage-collected and every consumer dropped its tensors from it (a consumer maps it
      copy-on-write, so a segment it may still read is never filled again). A new segment
      costs its pages' first touch, several times the copy.
    - `pool_idle`: seconds an idle kept segment waits before it goes back to the system
      (default 5).

    Registering twice with the same options is a no-op; with other options, an error
    (Ray keeps one class per name).
    """
    global _registered
    import ray.experimental

    cfg = _Config(
        token=token if token is not None else os.environ.get("FERRY_RAY_TOKEN") or None,
        force_remote=force_remote,
        quic=quic,
        max_host_mib=max_host_mib,
        fetch_timeout=fetch_timeout,
        pool_mib=pool_mib,
        pool_idle=pool_idle,
    )
    if _registered is not None:
        if _registered._config != cfg:
            raise ValueError(
                "ferry.ray.register() was already called with other options; Ray keeps one "
                "transport class per name for the life of the process"
            )
        return _registered
    # A class of its own carrying the configuration: Ray constructs managers without
    # arguments, and ships the class (by value: it is not importable by name) to actors.
    cls = type("FerryTransportConfigured", (FerryTransport,), {"_config": cfg})
    ray.experimental.register_tensor_transport(TRANSPORT, ["cpu", "cuda"], cls, _torch_type())
    _registered = cls
    return cls


def _torch_type() -> type:
    import torch

    cls: type = torch.Tensor
    return cls
