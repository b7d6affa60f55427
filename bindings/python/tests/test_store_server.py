"""A tensor store hosted by a Python program (`ferry.StoreServer`, `ferry.serve_weights`):
`ferry serve-weights` without the command, read back by `ferry.open_weights`."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import ferry
from tests.conftest import WAIT, unique_addr, wait_until


def checkpoint(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    tensors = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([1, -2, 3], dtype=np.int64),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def refused(addr: str) -> bool:
    """Whether connecting to the abstract unix address `addr` is refused."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect("\0" + addr.removeprefix("unix:"))
        except ConnectionRefusedError:
            return True
    return False


def test_a_store_server_serves_the_published_checkpoint_until_stopped(tmp_path: Path) -> None:
    path, want = checkpoint(tmp_path)
    addr = unique_addr("store")
    server = ferry.StoreServer(addr, [path], name="model")
    try:
        assert server.addr == addr
        assert server.addresses == [addr]
        assert server.serving
        bundle = ferry.open_weights(addr, "model")
        try:
            assert set(bundle) == set(want)
            for k, v in want.items():
                np.testing.assert_array_equal(bundle[k], v)
        finally:
            bundle.close()
    finally:
        assert server.stop() is True
    assert not server.serving
    # Nobody listens there any more (the listener task ends just after the server's run).
    wait_until(lambda: refused(addr), f"{addr} to refuse connections")


def test_a_store_server_as_a_context_manager_stops_on_exit(tmp_path: Path) -> None:
    path, want = checkpoint(tmp_path)
    addr = unique_addr("store-with")
    with ferry.StoreServer(addr, [path], name="m") as server:
        bundle = ferry.open_weights(server.addr, "m")
        try:
            np.testing.assert_array_equal(bundle["w"], want["w"])
        finally:
            bundle.close()
    assert not server.serving


def test_an_empty_store_needs_no_name_and_files_need_one(tmp_path: Path) -> None:
    path, _ = checkpoint(tmp_path)
    with pytest.raises(ValueError, match="name"):
        ferry.StoreServer(unique_addr("noname"), [path])
    with ferry.StoreServer(unique_addr("empty")) as server:
        assert server.serving


def test_a_bad_option_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--bucket-mib 0"):
        ferry.StoreServer(unique_addr("bucket"), bucket_mib=0)
    with pytest.raises(ValueError, match="--placement"):
        ferry.StoreServer(unique_addr("tiers"), cpu_budget_mib=4)


def test_serve_weights_serves_until_interrupted(tmp_path: Path) -> None:
    """`ferry.serve_weights` in a child process: it announces its address, serves the
    checkpoint, and a SIGINT ends it (KeyboardInterrupt, the store stopped)."""
    path, want = checkpoint(tmp_path)
    addr = unique_addr("serve-weights")
    script = textwrap.dedent(
        f"""
        import ferry
        try:
            ferry.serve_weights({addr!r}, [{str(path)!r}], name="model")
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == f"listening on {addr}", (line, proc.stderr and proc.stderr.read())
        bundle = ferry.open_weights(addr, "model")
        try:
            np.testing.assert_array_equal(bundle["b"], want["b"])
        finally:
            bundle.close()
        proc.send_signal(2)
        out, _ = proc.communicate(timeout=WAIT)
        assert out.strip() == "interrupted"
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
