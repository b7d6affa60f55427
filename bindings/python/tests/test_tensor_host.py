"""`ferry.ray`'s `TensorHost` without Ray: the blocks it hands out come from a pool whose
segments are filled again only once their id was freed and every peer released its tensors
from them, never while a peer still reads one; kept segments go back after `pool_idle`.

The host and its peer (a pipe connected to the host's unix address) are in this process:
the peer maps the host's memfds as any other process would (private, copy-on-write).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ferry import _native

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="TensorHost and shared memory are Linux-only"
)

WAIT = 30.0
"""Seconds any wait gives up after (a failure, never a measurement)."""

N = 1 << 18
"""Bytes of each block (whole pages)."""


def wait_for(what: str, probe: Callable[[], Any], until: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        v = probe()
        if until(v):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {WAIT} s waiting for {what} (last {v!r})")
        time.sleep(0.01)


def host(pool_idle: float = 5.0) -> _native.TensorHost:
    addr = f"unix:ferry-test-host-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    return _native.TensorHost([addr], pool_idle=pool_idle)


def put(h: _native.TensorHost, obj_id: str, fill: int) -> int:
    """Puts a block of N bytes, all `fill`, under `obj_id`; its address."""
    b = h.block(N)
    np.asarray(b)[:] = fill
    h.put(obj_id, b, [(0, [N], "u8")])
    return b.data_ptr


def fetch(p: _native.Pipe, obj_id: str) -> Any:
    p.send(json.dumps({"get": obj_id}), [], WAIT)
    m = p.recv(WAIT)
    assert json.loads(m.header) == {"ok": obj_id}
    return m.tensors[0]


def test_a_block_is_filled_again_only_after_its_peer_let_go() -> None:
    h = host()
    p = _native.connect(h.addresses[0])
    a_ptr = put(h, "a", 0xAA)
    held = fetch(p, "a")
    h.free("a")
    # The host let go, the peer has not: a new segment, and writing it changes nothing the
    # peer reads.
    b_ptr = put(h, "b", 0xBB)
    assert b_ptr != a_ptr
    st = h.pool_stats
    assert (st["created"], st["reused"], st["kept_segments"]) == (2, 0, 0), st
    assert bool((np.asarray(held) == 0xAA).all()), "the peer's bytes changed"
    # The peer lets go: the segment comes back and is filled again for the next id.
    del held
    wait_for("a's segment to come back", lambda: h.pool_stats, lambda s: s["kept_segments"] == 1)
    c_ptr = put(h, "c", 0xCC)
    assert c_ptr == a_ptr, "a kept segment of the same size was not reused"
    assert h.pool_stats["reused"] == 1
    got = fetch(p, "c")
    assert bool((np.asarray(got) == 0xCC).all()), "the peer reads stale bytes"
    assert h.pool_stats["withheld"] == 0
    p.close()
    h.close()


def test_a_block_whose_peer_closed_while_holding_it_is_never_filled_again() -> None:
    h = host()
    p = _native.connect(h.addresses[0])
    put(h, "a", 0x11)
    held = fetch(p, "a")
    h.free("a")
    p.close()  # an aborted fetch: the peer's mapping (and tensor) stays
    wait_for("a's segment to be withheld", lambda: h.pool_stats, lambda s: s["withheld"] == 1)
    put(h, "b", 0x22)
    st = h.pool_stats
    assert (st["created"], st["reused"]) == (2, 0), st
    assert bool((np.asarray(held) == 0x11).all()), "the peer's bytes changed"
    h.close()


def test_kept_blocks_go_back_after_pool_idle() -> None:
    h = host(pool_idle=0.2)
    put(h, "a", 1)
    h.free("a")
    assert h.pool_stats["kept_segments"] == 1
    st = wait_for(
        "the pool to give a's segment back", lambda: h.pool_stats, lambda s: s["kept_segments"] == 0
    )
    assert (st["kept_bytes"], st["given_back"]) == (0, 1), st
    h.close()


def test_a_reused_block_shows_no_earlier_bytes_past_its_own() -> None:
    h = host()
    put(h, "a", 0xEE)
    h.free("a")
    b = h.block(N - 100)  # the same segment (whole pages), 100 bytes shorter
    assert h.pool_stats["reused"] == 1
    p = _native.connect(h.addresses[0])
    np.asarray(b)[:] = 7
    h.put("b", b, [(0, [N - 100], "u8")])
    # The peer maps the whole segment: the 100 bytes past the block are zeros, not 0xEE.
    got = np.asarray(fetch(p, "b"))
    assert bool((got == 7).all())
    past = ctypes.string_at(got.__array_interface__["data"][0] + N - 100, 100)
    assert past == bytes(100), past
    p.close()
    h.close()
