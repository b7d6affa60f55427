"""`ferry.spawn`: an app in a child process, and a client connected to it."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from ._app import App, _locate
from ._client import Client


def _die_with_parent(parent: int) -> None:
    """SIGTERM this process when `parent` dies (Linux: PR_SET_PDEATHSIG; elsewhere a
    watchdog thread)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="ferry-spawn-watchdog", daemon=True).start()


@contextlib.contextmanager
def spawn(
    app: App, addr: str | None = None, *, timeout: float = 60.0, **options: Any
) -> Iterator[Client]:
    """Starts `app` in a child process (serving `addr`, default a fresh abstract unix
    name), connects a `ferry.Client` to it, and stops the child (SIGTERM, then SIGKILL
    after 10 s) on exit. The child also dies when this process does. `options` are
    `App.serve`'s (JSON values). The app must be a module-level variable: the child
    imports its module (an app of the main script: runs the script with a `__name__`
    other than `"__main__"`, so keep its own work under `if __name__ == "__main__":`)."""
    module, attr = _locate(app)
    if module == "__main__":
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if main_file is None:
            raise TypeError(
                "ferry.spawn: an app defined in an interactive session cannot be started in a child"
            )
        module = os.path.abspath(main_file)
    addr = addr or f"unix:ferry-spawn-{os.getpid()}-{secrets.token_hex(4)}"
    r, w = os.pipe()
    cmd = [
        sys.executable,
        "-m",
        "ferry._child",
        module,
        attr,
        addr,
        json.dumps(options),
        str(w),
        str(os.getpid()),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path),
    }
    child = subprocess.Popen(cmd, pass_fds=(w,), env=env)
    os.close(w)
    reader = os.fdopen(r)
    try:
        ready, _, _ = select.select([reader], [], [], timeout)
        line = reader.readline() if ready else ""
        if not line:
            code = child.poll()
            if code is None:
                raise TimeoutError(f"ferry.spawn: {app.name} did not listen within {timeout} s")
            raise RuntimeError(f"ferry.spawn: {app.name} exited with code {code} before serving")
        kind, payload = json.loads(line)
        if kind != "ready":
            raise RuntimeError(f"ferry.spawn: {app.name} failed to start: {payload}")
        client = Client.connect(payload[0], token=options.get("token"))
        try:
            yield client
        finally:
            client.close()
    finally:
        reader.close()
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
