"""Checks an installed ferry-client as a newcomer gets it (`cargo xtask
sdk-python-install` runs it with the python of a brand-new venv, after a plain
`pip install ./sdks/python`): the package imports from the venv, not from the source
tree; its hot modules are compiled, or not, as expected (all of them or none); and a
generated client calls a real `ferry serve` (`$FERRY_BIN`) and gets a numpy tensor back.

    python check_install.py --expect-compiled 1|0

Not a pytest module (its name does not start with `test_`): it needs a venv of its own.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import select
import signal
import subprocess
import sys
from pathlib import Path


def fail(msg: str) -> None:
    print(f"check_install: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def check_package(expect_compiled: bool) -> None:
    import ferry_client

    where = Path(ferry_client.__file__ or "").resolve()
    if not where.is_relative_to(Path(sys.prefix).resolve()):
        fail(f"ferry_client was imported from {where}, not from the venv {sys.prefix}")
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    extensions = sorted(
        p.name for p in where.parent.iterdir() if p.name.endswith(suffixes)
    )
    print(
        f"check_install: ferry_client {ferry_client.__version__} in {where.parent}: "
        f"COMPILED={ferry_client.COMPILED}, {len(extensions)} compiled module(s)"
    )
    if ferry_client.COMPILED != expect_compiled:
        fail(
            f"ferry_client.COMPILED is {ferry_client.COMPILED}, expected {expect_compiled} "
            "(see the pip output above for why)"
        )
    compiled = {e.split(".", 1)[0] for e in extensions}
    if expect_compiled:
        # setup.py's COMPILED list, every one of them (mypyc leaves each module's .py
        # beside its extension, which shadows it).
        hot = ["_connection", "_io", "_outgoing", "_rpc", "_session", "_shm", "_wire"]
        hot += ["client", "pipe", "tensors"]
        missing = [m for m in hot if m not in compiled]
        if missing:
            fail(f"not compiled: {missing} (extensions: {extensions})")
    elif extensions:
        fail(
            f"pure Python was expected, but compiled modules were installed: {extensions}"
        )


def check_call() -> None:
    from ferry_client.generated.demo import DemoClient

    ferry = os.environ.get("FERRY_BIN")
    if not ferry:
        fail("FERRY_BIN is not set (the `ferry` binary to serve the demo API)")
        return
    addr = f"unix:ferry-check-install-{os.getpid()}"
    server = subprocess.Popen(
        [ferry, "serve", addr],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], 30.0)
        line = server.stdout.readline() if ready else b""
        if not line.startswith(b"listening on"):
            fail(f"ferry serve {addr} did not start (got {line!r})")
        with DemoClient.connect(addr) as demo:
            total = demo.add(1.0, 2.0)
            if total != 3.0:
                fail(f"add(1, 2) returned {total!r}")
            t = demo.create_tensor([2, 3], "f32", fill=1.5)
            if t.shape != (2, 3) or str(t.dtype) != "float32" or t.sum() != 9.0:
                fail(f"create_tensor returned {t!r}")
        print(f"check_install: add and create_tensor answered by `ferry serve {addr}`")
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--expect-compiled", choices=("0", "1"), required=True)
    args = parser.parse_args()
    check_package(args.expect_compiled == "1")
    check_call()
    print("check_install: ok")


if __name__ == "__main__":
    main()
