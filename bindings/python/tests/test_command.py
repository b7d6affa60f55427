"""The `ferry` command the package installs (`[project.scripts]`) and `python -m ferry`:
the Rust binary's command line run by the native module (`ferry info`, `serve`, `call`,
`discover`, `bench` with its peer started as `python -m ferry __echo`), beside `ferry serve
MODULE:APP` for Python apps. Real processes, abstract unix sockets, bounded waits."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import ferry
from tests.conftest import WAIT, unique_addr

SUBCOMMANDS = ("serve", "call", "discover", "sdk", "serve-weights", "bench", "info")


def ferry_command() -> str:
    """The installed `ferry` script of this interpreter's environment."""
    path = Path(sysconfig.get_path("scripts")) / "ferry"
    assert path.exists(), f"the package installed no `ferry` command ({path} is missing)"
    return str(path)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=WAIT, check=False)


@pytest.mark.parametrize("how", ["script", "python -m"])
def test_ferry_info_names_the_version_transports_and_channels(how: str) -> None:
    cmd = [ferry_command()] if how == "script" else [sys.executable, "-m", "ferry"]
    r = run(*cmd, "info")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"ferry {ferry.__version__} (protocol version "), r.stdout
    assert any(line.startswith("transports: ") and "(unix:)" in line for line in lines), r.stdout
    assert any(line.startswith("channels (priority order): ") for line in lines), r.stdout


def test_ferry_help_lists_every_subcommand() -> None:
    r = run(ferry_command(), "--help")
    assert r.returncode == 0, r.stderr
    listed = {
        line.split()[0] for line in r.stdout.splitlines() if line.startswith("  ") and line.split()
    }
    assert set(SUBCOMMANDS) <= listed, r.stdout


def test_a_bad_subcommand_is_refused_by_name_without_a_traceback() -> None:
    r = run(ferry_command(), "no-such-command")
    assert r.returncode == 2
    assert "no-such-command" in r.stderr
    assert "Traceback" not in r.stderr


def test_ferry_serve_answers_ferry_call_and_discover_then_stops_on_sigint() -> None:
    addr = unique_addr("cmd")
    server = subprocess.Popen(
        [ferry_command(), "serve", addr],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.strip() == f"listening on {addr}", line
        r = run(ferry_command(), "call", addr, "add", '{"a": 1.5, "b": 2}')
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == 3.5
        r = run(sys.executable, "-m", "ferry", "discover", addr)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert "add" in {m["name"] for m in doc["methods"]}
        server.send_signal(signal.SIGINT)
        assert server.wait(WAIT) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(WAIT)


def test_ferry_call_to_nobody_fails_naming_the_address() -> None:
    addr = unique_addr("nobody")
    r = run(ferry_command(), "call", addr, "add", '{"a": 1, "b": 2}', "--timeout", "5")
    assert r.returncode == 1
    assert addr.removeprefix("unix:") in r.stderr, r.stderr


def test_ferry_bench_starts_its_peer_through_python_m_ferry() -> None:
    r = run(
        ferry_command(),
        "bench",
        "--only",
        "local",
        "--shape",
        "16",
        "--iters",
        "2",
        "--small-iters",
        "2",
        "--warmup",
        "0",
        "--big-mib",
        "0",
        "--no-rpc",
        "--shm-memory-mib",
        "0",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    peer_rows = [row for row in rows if row["backend"] == "local"]
    assert any(row["case"] == "rtt-64B" for row in peer_rows), rows


@pytest.mark.parametrize(
    ("argv", "app"),
    [
        (["serve", "tests.apps:app", "unix:x"], True),
        (["serve", "--app-dir", ".", "mod.sub:app"], True),
        (["serve", "tests.apps", "unix:x"], True),
        (["serve"], False),
        (["serve", "unix:x"], False),
        (["serve", "--api", "conformance", "unix:x"], False),
        (["serve", "unix:x", "--http", "localhost:8080"], False),
        (["serve", "--http", "127.0.0.1:0", "quic://127.0.0.1:0"], False),
        (["call", "unix:x", "add"], False),
    ],
)
def test_serve_tells_a_python_app_from_the_native_command(argv: list[str], app: bool) -> None:
    from ferry.__main__ import _serves_app

    assert _serves_app(argv) is app
