"""Where a tensor store keeps tensor references: a cpu tier (shared memory) above a disk
tier, each with a byte budget, and the policy that moves references between them
(`ferry serve-weights --placement flow --cpu-budget-mib 512`; PROTOCOL.md section 20).

    r = keep(client, weights)                  # a TensorRef (ferry_client.refs)
    placement(client, r).placement             # "cpu" or "disk"
    place(client, r, "cpu")                    # pinned in the cpu tier (moved in the background)
    schedule(client, [r1, r2, r3, r1, r2, r3]) # the next uses: the policy prefetches ahead
    set_store_placement(client, policy="lru", cpu_budget_bytes=1 << 30)

A use of a reference (a call taking it, `fetch`) reads it in from disk when it is there;
what the cpu tier keeps afterwards is the policy's choice (`pinned`, `genoa`, `lru`,
`flow`). A reference in use is never moved under its user: while an array `fetch`
returned (or a call) holds its bytes it stays in the cpu tier, unchanged
(`RefPlacement.in_use`); a move down the policy decides meanwhile waits until it is let
go (`RefPlacement.deferred`). On a store started
without `--placement`, references stay in memory as kept: `store_placement` says
`tiers=False` and the setters raise `InvalidParamsError`.

A store with a device tier (`ferry serve-weights --placement flow --cuda-budget-mib N`,
`ferry_store::PlacementOptions::device`) keeps references
made from that device (`cuda:0`) on it within its own budget, or below it in the cpu
tier and on disk: each use gets them on the device (uploaded if need be), and
`store_placement(client).device` reports the tier; `place(client, r, "cuda:0")` pins one
there and `set_store_placement(client, device_budget_bytes=...)` resizes it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .errors import ResultError
from .refs import TensorRef

if TYPE_CHECKING:
    from .client import Client

__all__ = [
    "DeviceTier",
    "PlacementStats",
    "RefPlacement",
    "StorePlacement",
    "place",
    "placement",
    "schedule",
    "set_store_placement",
    "store_placement",
    "wait_placed",
]

Where = Literal["cpu", "disk", "auto"] | str
"""`cpu`, `disk`, `auto`, or the store's device tier's device (`cuda:0`)."""


def _dict(r: object, method: str) -> dict[str, object]:
    if not isinstance(r, dict):
        raise ResultError(f"{method} answered {r!r:.100}")
    return r


def _int(d: dict[str, object], key: str, method: str) -> int:
    v = d.get(key)
    if type(v) is not int:
        raise ResultError(f"{method}: {key} is {v!r:.40}, not an integer")
    return v


def _opt_int(d: dict[str, object], key: str, method: str) -> int | None:
    return None if d.get(key) is None else _int(d, key, method)


def _float(d: dict[str, object], key: str, method: str) -> float:
    v = d.get(key)
    if not isinstance(v, (int, float)):
        raise ResultError(f"{method}: {key} is {v!r:.40}")
    return float(v)


def _opt_str(d: dict[str, object], key: str) -> str | None:
    v = d.get(key)
    return None if v is None else str(v)


@dataclass(frozen=True)
class RefPlacement:
    """Where a reference is."""

    id: str
    placement: str
    """`cpu`, `disk`, or a device (`cuda:0`: on the store's device tier, or on a device
    without one, where it stays)."""
    pinned: str
    """How it was placed by hand: `auto` (by the policy), `cpu`, `disk` or the device."""
    moving: bool
    """A move between tiers is under way."""
    in_use: bool
    """A call or a reader (an array `fetch` returned) holds its bytes."""
    nbytes: int
    deferred: bool = False
    """The policy let it go while in use: it stays in the cpu tier until let go."""

    @staticmethod
    def from_json(r: object, method: str) -> RefPlacement:
        """Parses an answer; `ResultError` when malformed."""
        d = _dict(r, method)
        if not all(isinstance(d.get(k), str) for k in ("id", "placement", "pinned")):
            raise ResultError(f"{method} answered {d!r:.100}")
        return RefPlacement(
            id=str(d["id"]),
            placement=str(d["placement"]),
            pinned=str(d["pinned"]),
            moving=bool(d.get("moving")),
            in_use=bool(d.get("in_use")),
            nbytes=_int(d, "bytes", method),
            deferred=bool(d.get("deferred")),
        )


@dataclass(frozen=True)
class PlacementStats:
    """What the store's tiers did so far."""

    uses: int
    hits: int
    """Uses of a reference placed in the cpu tier (kept, pinned, or prefetched ahead)."""
    waits: int
    """Uses that waited for bytes from disk (read them, or waited for a prefetch)."""
    bytes_read: int
    """Bytes read from disk into memory."""
    bytes_written: int
    """Bytes written to disk (each reference at most once)."""
    prefetches: int
    stalled_ms: float
    """Milliseconds uses waited for bytes from disk."""
    last_error: str | None
    deferred: int = 0
    """Moves down deferred because the reference was in use."""
    held_over_bytes: int = 0
    """Bytes of references waiting for their users to let go before going down."""


@dataclass(frozen=True)
class DeviceTier:
    """The store's device tier (`cuda:N`) above its cpu tier, for references kept from
    that device: every use gets them on the device, its policy decides what stays."""

    device: str
    policy: str
    budget_bytes: int
    used_bytes: int
    uses: int
    hits: int
    """Uses of a reference placed on the device (kept, pinned, or uploaded ahead)."""
    waits: int
    """Uses that waited for an upload."""
    bytes_up: int
    """Bytes copied to the device."""
    bytes_down: int
    """Bytes copied from the device to the host (each reference at most once)."""
    prefetches: int
    stalled_ms: float
    last_error: str | None
    deferred: int
    held_over_bytes: int

    @staticmethod
    def from_json(r: object, method: str) -> DeviceTier:
        """Parses `store.placement.get`'s `device`; `ResultError` when malformed."""
        d = _dict(r, method)
        s = _dict(d.get("stats"), method)
        if not all(isinstance(d.get(k), str) for k in ("device", "policy")):
            raise ResultError(f"{method} answered a device tier of {d!r:.100}")
        return DeviceTier(
            device=str(d["device"]),
            policy=str(d["policy"]),
            budget_bytes=_int(d, "budget_bytes", method),
            used_bytes=_int(d, "used_bytes", method),
            uses=_int(s, "uses", method),
            hits=_int(s, "hits", method),
            waits=_int(s, "waits", method),
            bytes_up=_int(s, "bytes_up", method),
            bytes_down=_int(s, "bytes_down", method),
            prefetches=_int(s, "prefetches", method),
            stalled_ms=_float(s, "stalled_ms", method),
            last_error=_opt_str(s, "last_error"),
            deferred=_int(s, "deferred", method),
            held_over_bytes=_int(s, "held_over_bytes", method),
        )


@dataclass(frozen=True)
class StorePlacement:
    """The store's placement: policy, budgets, usage."""

    tiers: bool
    """False: references stay in memory as kept (no `--placement`)."""
    policy: str
    cpu_budget_bytes: int | None
    disk_budget_bytes: int | None
    cpu_used_bytes: int
    disk_used_bytes: int
    disk_dir: str | None
    stats: PlacementStats | None
    device: DeviceTier | None = None
    """The device tier (None without one)."""

    @staticmethod
    def from_json(r: object, method: str) -> StorePlacement:
        """Parses an answer; `ResultError` when malformed."""
        d = _dict(r, method)
        s = d.get("stats")
        stats = None
        if s is not None:
            sd = _dict(s, method)
            stats = PlacementStats(
                uses=_int(sd, "uses", method),
                hits=_int(sd, "hits", method),
                waits=_int(sd, "waits", method),
                bytes_read=_int(sd, "bytes_read", method),
                bytes_written=_int(sd, "bytes_written", method),
                prefetches=_int(sd, "prefetches", method),
                stalled_ms=_float(sd, "stalled_ms", method),
                last_error=_opt_str(sd, "last_error"),
                deferred=_int(sd, "deferred", method) if "deferred" in sd else 0,
                held_over_bytes=_int(sd, "held_over_bytes", method)
                if "held_over_bytes" in sd
                else 0,
            )
        dev = d.get("device")
        return StorePlacement(
            tiers=bool(d.get("tiers")),
            policy=str(d.get("policy")),
            cpu_budget_bytes=_opt_int(d, "cpu_budget_bytes", method),
            disk_budget_bytes=_opt_int(d, "disk_budget_bytes", method),
            cpu_used_bytes=_int(d, "cpu_used_bytes", method),
            disk_used_bytes=_int(d, "disk_used_bytes", method),
            disk_dir=_opt_str(d, "disk_dir"),
            stats=stats,
            device=None if dev is None else DeviceTier.from_json(dev, method),
        )


def placement(client: Client, ref: TensorRef) -> RefPlacement:
    """Where `ref` is (looking is not a use)."""
    r = client.call("store.ref.placement", {"id": ref.id})
    return RefPlacement.from_json(r, "store.ref.placement")


def place(client: Client, ref: TensorRef, where: Where) -> RefPlacement:
    """Places `ref` by hand: `cpu` (pinned in the cpu tier, within its budget), `disk`
    (pinned on disk: each use reads it), `auto` (back to the policy), or for a reference
    kept from the store's device tier's device, that device (`cuda:0`: pinned there). The
    move runs in the background (`moving`); `wait_placed` waits for it."""
    r = client.call("store.ref.place", {"id": ref.id, "placement": where})
    return RefPlacement.from_json(r, "store.ref.place")


def wait_placed(client: Client, ref: TensorRef, timeout: float = 30.0) -> RefPlacement:
    """Waits until no move of `ref` is under way (at most `timeout` seconds, then
    `TimeoutError`)."""
    deadline = time.monotonic() + timeout
    while True:
        p = placement(client, ref)
        if not p.moving:
            return p
        if time.monotonic() > deadline:
            raise TimeoutError(f"reference {ref.id} still moving after {timeout} s")
        time.sleep(0.005)


def schedule(client: Client, refs: Iterable[TensorRef]) -> int:
    """Declares the order of the next uses of `refs` (repeats allowed: a model's layers,
    pass after pass), replacing the one declared before; the `flow` policy then reads the
    next ones in while the caller computes. The count scheduled (0 without tiers)."""
    r = _dict(
        client.call("store.ref.schedule", {"ids": [x.id for x in refs]}),
        "store.ref.schedule",
    )
    return _int(r, "scheduled", "store.ref.schedule")


def store_placement(client: Client) -> StorePlacement:
    """The store's policy, budgets, usage and counts."""
    r = client.call("store.placement.get", {})
    return StorePlacement.from_json(r, "store.placement.get")


def set_store_placement(
    client: Client,
    *,
    policy: str | None = None,
    cpu_budget_bytes: int | None = None,
    disk_budget_bytes: int | None = None,
    device_budget_bytes: int | None = None,
) -> StorePlacement:
    """Changes the policy (`pinned`, `genoa`, `lru`, `flow`; a change starts the cpu tier
    over) and the budgets, each when given. `InvalidParamsError` for an unknown policy or
    a store without tiers (or `device_budget_bytes` without a device tier),
    `LimitExceededError` naming `cpu_budget_bytes` / `disk_budget_bytes` /
    `device_budget_bytes` for a budget below what is pinned or stored."""
    params: dict[str, object] = {}
    if policy is not None:
        params["policy"] = policy
    if cpu_budget_bytes is not None:
        params["cpu_budget_bytes"] = cpu_budget_bytes
    if disk_budget_bytes is not None:
        params["disk_budget_bytes"] = disk_budget_bytes
    if device_budget_bytes is not None:
        params["device_budget_bytes"] = device_budget_bytes
    r = client.call("store.placement.set", params)
    return StorePlacement.from_json(r, "store.placement.set")
