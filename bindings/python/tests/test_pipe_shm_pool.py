"""`ferry.connect` / `ferry.listen(shm_pool_mib=...)`: the pipe's shared-memory pool limit,
and a full pool's error naming that argument rather than Rust options (issue 45 point 5)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import ferry
from tests.conftest import WAIT, unique_addr


def _pair(shm_pool_mib: int | None) -> tuple[ferry.Pipe, ferry.Pipe]:
    """(accepted, connected): the connecting side's pool holds `shm_pool_mib` MiB."""
    addr = unique_addr("shm-pool")
    listener = ferry.listen(addr)
    out: list[Any] = []
    t = threading.Thread(
        target=lambda: out.append(ferry.connect(addr, shm_pool_mib=shm_pool_mib)),
        daemon=True,
    )
    t.start()
    a = listener.accept(timeout=WAIT)
    t.join(WAIT)
    assert out, "connect did not return"
    return a, out[0]


def test_a_full_pool_names_shm_pool_mib_not_rust_options() -> None:
    server, client = _pair(shm_pool_mib=2)
    assert client.channel == "shm"
    with pytest.raises(OSError) as e:
        client.send("big", [np.zeros(4 << 20, np.uint8)])
    text = str(e.value)
    assert "shm_pool_mib=" in text, text
    assert "ShmOptions" not in text and "with_options" not in text, text
    # What fits still goes, on the same pipe.
    client.send("small", [np.full(1 << 20, 7, np.uint8)])
    header, ts = server.recv(timeout=WAIT)
    assert header == "small" and ts[0][-1] == 7


def test_the_default_pool_takes_a_large_tensor() -> None:
    server, client = _pair(shm_pool_mib=None)
    client.send("big", [np.full(4 << 20, 3, np.uint8)])
    header, ts = server.recv(timeout=WAIT)
    assert header == "big" and ts[0][-1] == 3


def test_a_pool_under_2_mib_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="shm_pool_mib=1"):
        ferry.connect(unique_addr("never-dialed"), shm_pool_mib=1)
