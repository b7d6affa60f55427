"""`ferry.spawn(app)`: the app in a child process and a client connected to it; the child
ends with the block, and with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ferry
from ferry.errors import Refused
from tests import apps
from tests.conftest import ROOT, WAIT, pid_gone, read_line, unique_addr, wait_until


def test_spawn_serves_and_the_child_ends() -> None:
    with ferry.spawn(apps.app) as c:
        assert c.channel == "shm"
        child = c.call("pid")
        assert child != os.getpid()
        assert not pid_gone(child)
        assert c.call("add", {"a": 2, "b": 40}) == 42.0
        np.testing.assert_array_equal(c.call("scale", [np.ones(3), 2]), np.full(3, 2.0))
    assert pid_gone(child)
    assert c.closed


def test_spawn_at_an_address_other_clients_reach() -> None:
    addr = unique_addr("spawn")
    with ferry.spawn(apps.app, addr) as c, ferry.Client.connect(addr, timeout=WAIT) as other:
        assert other.call("pid") == c.call("pid")
        assert other.call("greet", ["other"]) == "hello other"


def test_spawn_passes_serve_options() -> None:
    addr = unique_addr("token")
    with ferry.spawn(apps.app, addr, token="s3cret") as c:
        assert c.call("add", [1, 1]) == 2.0
        with ferry.Client.connect(addr, token="s3cret", timeout=WAIT) as ok:
            assert ok.call("add", [2, 2]) == 4.0
        with pytest.raises(Refused) as refused:
            ferry.Client.connect(addr, timeout=WAIT)
        assert refused.value.reason == "bad_token"


def test_spawn_reports_a_child_that_cannot_serve() -> None:
    with (
        pytest.raises(RuntimeError, match="failed to start: TypeError"),
        ferry.spawn(apps.app, no_such_option=1),
    ):
        pass


def test_spawn_refuses_an_app_that_is_not_module_level() -> None:
    local = ferry.App("local")
    with pytest.raises(TypeError, match="module-level"), ferry.spawn(local):
        pass


def test_spawn_an_app_of_the_main_script(tmp_path: Path) -> None:
    """The app of a script run as `__main__`: the child runs the file under another
    name, so the script's own main block does not run there."""
    script = tmp_path / "main_app.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            import ferry

            app = ferry.App("mainapp")

            @app.function
            def double(x: int) -> int:
                return 2 * x

            @app.function
            def where() -> str:
                return __name__

            if __name__ == "__main__":
                with ferry.spawn(app) as c:
                    print(c.call("double", [21]), c.call("where"), flush=True)
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["42", "__ferry_spawn__"]


PARENT = """
import sys, time
import ferry
from tests import apps

with ferry.spawn(apps.app) as c:
    print(c.call("pid"), flush=True)
    time.sleep(600)
"""


def test_child_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(parent.stdout)
        assert line.strip().isdigit(), line
        child = int(line)
        assert not pid_gone(child)
        parent.send_signal(signal.SIGKILL)
        assert parent.wait(WAIT) == -signal.SIGKILL
        wait_until(lambda: pid_gone(child), f"the spawned child {child} to exit")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
