"""The tensor store from Python: `ferry serve-weights` publishes a safetensors checkpoint,
`open_weights` / `open_bundle` map it zero-copy, versions are held while arrays live and
unmapped when they die, a SIGKILLed reader lets go, and errors are typed."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from safetensors.numpy import save_file

import ferry
from ferry import Client, RpcError, _native, open_bundle, open_weights
from ferry.store import publish
from tests.client.servers import Server, unique_addr


def checkpoint(path: Path) -> dict[str, npt.NDArray[Any]]:
    rng = np.random.default_rng(7)
    sd = {f"layers.{i}.weight": rng.standard_normal((64, 64)).astype(np.float32) for i in range(50)}
    sd["embed"] = rng.standard_normal((1000, 32)).astype(np.float16)
    sd["steps"] = np.arange(10, dtype=np.int64)
    save_file(sd, str(path))
    return sd


@pytest.fixture
def weights(tmp_path: Path) -> Iterator[tuple[Server, dict[str, npt.NDArray[Any]]]]:
    sd = checkpoint(tmp_path / "model.safetensors")
    # `--delta-bases 0`: the store keeps no superseded version for deltas of its own, so
    # `held_versions` shows exactly what readers hold (these tests watch their holds).
    s = Server(
        "weights",
        unique_addr("weights"),
        [
            "serve-weights",
            str(tmp_path / "model.safetensors"),
            "--name",
            "m",
            "--delta-bases",
            "0",
            "--addr",
        ],
    )
    try:
        yield s, sd
    finally:
        s.kill()


def test_open_weights_over_quic_with_a_pin_and_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`open_weights` reaches a store on another host's kind of address: QUIC, the server
    pinned by the hash `ferry serve-weights` prints, with its bearer token (a wrong one is
    refused, naming the address)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # the server's QUIC identity
    sd = checkpoint(tmp_path / "model.safetensors")
    argv = ["serve-weights", str(tmp_path / "model.safetensors"), "--name", "m"]
    s = Server("weights", "quic://127.0.0.1:0", [*argv, "--token", "s3cret", "--addr"])
    try:
        addr = s.listening
        assert addr.startswith("quic://127.0.0.1:") and "#sha256=" in addr, addr
        b = open_weights(addr, "m", token="s3cret")
        try:
            assert b.version == 1 and sorted(b) == sorted(sd)
            for k, v in sd.items():
                assert b[k].dtype == v.dtype and np.array_equal(b[k], v), k
            assert b._client is not None and b._client.transport == "quic"
        finally:
            b.close()
        with pytest.raises(ferry.Refused) as e:
            open_weights(addr, "m", token="wrong")
        assert e.value.reason == "bad_token" and addr.split("#")[0] in str(e.value)
    finally:
        s.kill()


def until(what: str, f: object, timeout: float = 10.0) -> None:
    assert callable(f)
    deadline = time.monotonic() + timeout
    while not f():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout} s")
        time.sleep(0.02)


def _received(a: Any) -> object:
    """The received tensor (`_native.TensorRef`) at the end of `a`'s base chain."""
    base = a.base
    while base is not None and not isinstance(base, _native.TensorRef):
        base = getattr(base, "base", None)
    return base


def held_versions(c: Client) -> list[int]:
    listed = c.call("store.list", {})
    assert isinstance(listed, list)
    return [v for b in listed for v in b["held_versions"]]


def test_a_checkpoint_opens_zero_copy_and_equal(
    weights: tuple[Server, dict[str, npt.NDArray[Any]]],
) -> None:
    server, sd = weights
    b = open_weights(server.addr, "m")
    try:
        assert (b.name, b.version) == ("m", 1)
        assert sorted(b) == sorted(sd)
        for k, v in sd.items():
            got = b[k]
            assert got.dtype == v.dtype and got.shape == v.shape
            assert np.array_equal(got, v), k
            assert not got.flags.writeable
        # One bucket, one received tensor (one mapping): every array views it.
        first, last = _received(b["layers.0.weight"]), _received(b["layers.49.weight"])
        assert isinstance(first, _native.TensorRef) and first is last
        assert first.nbytes == b.nbytes
        assert b.metadata == {"files": ["model.safetensors"], "format": "safetensors"}
    finally:
        b.close()


def test_digests_and_errors_are_typed(
    weights: tuple[Server, dict[str, npt.NDArray[Any]]],
) -> None:
    server, _ = weights
    with Client.connect(server.addr) as c:
        with pytest.raises(RpcError) as e:
            open_bundle(c, "m", expect_digest="blake3:" + "0" * 64)
        assert e.value.code == -32602 and "digest" in e.value.message
        with pytest.raises(RpcError) as e:
            open_bundle(c, "nope")
        assert e.value.code == -32009
        with pytest.raises(RpcError) as e:
            open_bundle(c, "m", 7)
        assert e.value.code == -32009
        until("the digest", lambda: c.call("store.list", {})[0]["digest"] is not None)
        digest = c.call("store.list", {})[0]["digest"]
        checked = open_bundle(c, "m", expect_digest=digest)
        assert checked.digest == digest


def test_a_reader_holds_its_version_until_its_arrays_die(
    weights: tuple[Server, dict[str, npt.NDArray[Any]]],
) -> None:
    server, sd = weights
    with Client.connect(server.addr) as c:
        old = open_bundle(c, "m")
        w = old["layers.3.weight"]
        new = {k: (v + 1).astype(v.dtype) for k, v in sd.items()}
        assert publish(c, "m", new, {"step": 2})["version"] == 2
        latest = open_bundle(c, "m")
        assert latest.version == 2 and latest.metadata == {"step": 2}
        assert np.array_equal(latest["layers.3.weight"], sd["layers.3.weight"] + 1)
        assert np.array_equal(w, sd["layers.3.weight"]), "a held version never changes"
        assert held_versions(c) == [1]
        again = open_bundle(c, "m", 1)
        assert np.array_equal(again["steps"], sd["steps"])
        del old, w, again
        gc.collect()
        # The server frees it once this side let go of its buckets (the leases go back
        # with the last view; that the mapping goes too is the Rust core's to test).
        until("the server frees version 1", lambda: held_versions(c) == [])
        del latest


READER = textwrap.dedent(
    """
    import sys, time
    from ferry import open_weights
    b = open_weights(sys.argv[1], "m")
    print(b.version, flush=True)
    time.sleep(60)
    """
)


def test_a_killed_reader_releases_its_version(
    weights: tuple[Server, dict[str, npt.NDArray[Any]]],
) -> None:
    server, sd = weights
    reader = subprocess.Popen([sys.executable, "-c", READER, server.addr], stdout=subprocess.PIPE)
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == b"1"
        with Client.connect(server.addr) as c:
            publish(c, "m", {k: v * 2 for k, v in sd.items()})
            assert held_versions(c) == [1], "the reader holds version 1"
            os.kill(reader.pid, signal.SIGKILL)
            reader.wait(timeout=10)
            until("the killed reader's version is freed", lambda: held_versions(c) == [])
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait(timeout=10)
        if reader.stdout is not None:
            reader.stdout.close()
