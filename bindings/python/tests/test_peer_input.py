"""Input that must not break a Python server or listener (issue 43 point 6): a reference
TTL too long to count is a `ValueError` naming `ttl` (not a `PanicException`) and the server
goes on serving; a `ref_ttl` past 365 days is refused naming it; a same-user peer that
sends junk to a `Listener` is logged and skipped, and the same `accept()` call returns the
good client that connects next. Real server processes and real sockets."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ferry
from ferry import _native
from tests.conftest import WAIT, unique_addr, wait_until
from tests.refs_app import app


def test_a_ttl_past_365_days_is_a_value_error_naming_ttl_and_the_server_goes_on() -> None:
    with ferry.spawn(app, unique_addr("ttl")) as c:
        for ttl in [1e300, 365 * 86400 + 1.0]:
            with pytest.raises(ferry.RpcError) as info:
                c.call("embed", {"n": 2, "ttl": ttl})
            reason = info.value.data["reason"] if isinstance(info.value.data, dict) else ""
            assert reason.startswith("ValueError: ttl=") and "365 days" in reason, info.value.data
        kept = c.call("embed", {"n": 3, "ttl": 365 * 86400.0})
        assert kept.expires_ms is not None


def test_a_ref_ttl_past_365_days_is_refused_naming_it() -> None:
    for ref_ttl in [1e300, 365 * 86400 + 1.0]:
        with pytest.raises(ValueError, match="ref_ttl"):
            _native.Server("t", "0", None, ref_ttl=ref_ttl)
    _native.Server("t", "0", None, ref_ttl=365 * 86400.0)


def test_a_junk_peer_is_logged_and_the_same_accept_returns_the_next_good_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ferry")
    path = str(tmp_path / "listener.sock")
    listener = ferry.listen(f"unix:{path}")
    got: dict[str, Any] = {}

    def accept() -> None:
        try:
            got["pipe"] = listener.accept(timeout=WAIT)
        except BaseException as e:  # reported by the assertion below
            got["error"] = e

    waiter = threading.Thread(target=accept)
    waiter.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as junk:
        junk.connect(path)
        junk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
    wait_until(
        lambda: [r for r in caplog.records if "handshake failed" in r.getMessage()],
        "the junk connection's log record",
    )
    assert waiter.is_alive() and not got, got
    good = ferry.connect(f"unix:{path}")
    waiter.join(WAIT)
    assert "error" not in got, got.get("error")
    server = got["pipe"]
    good.send({"hello": 1}, [np.arange(4, dtype=np.float32)])
    header, tensors = server.recv(timeout=WAIT)
    assert header == {"hello": 1} and tensors[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    record = next(r for r in caplog.records if "handshake failed" in r.getMessage())
    assert record.name == "ferry" and record.levelno == logging.WARNING
    assert "\n" not in record.getMessage()


def test_accept_refuses_a_nan_timeout_and_gives_up_at_once_on_a_negative_one() -> None:
    listener = ferry.listen(unique_addr("timeouts"))
    with pytest.raises(ValueError, match="timeout"):
        listener.accept(timeout=float("nan"))
    with pytest.raises(TimeoutError, match=r"accept\(timeout=-1"):
        listener.accept(timeout=-1.0)
