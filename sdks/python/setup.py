"""Builds ferry-client. Its hot modules (framing, JSON-RPC, shm, the clients) are compiled
to C with mypyc when they can be: mypy is a build requirement (pyproject.toml), and a C
compiler with the Python headers must be present. The compiled modules behave as the
Python ones (the same source, type-checked with `mypy --strict`); a call costs about a
third less. Without a compiler, or with `FERRY_PURE_PYTHON=1` set, or if compiling fails,
the package installs as pure Python, and says so (`ferry_client.COMPILED`).

Configuration is in pyproject.toml; this file only adds the optional extension modules.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# Modules on the path of every call. Others stay interpreted: `errors` and `rpc_errors`
# (generated clients subclass their exceptions), `_options` (`ConnectOptions` is a plain
# dataclass, used only to connect) and those that use weak references or ctypes (`_cuda*`,
# `_cupy`), which compiled classes do not support.
COMPILED = [
    "ferry_client/_connection.py",
    "ferry_client/_io.py",
    "ferry_client/_outgoing.py",
    "ferry_client/_rpc.py",
    "ferry_client/_session.py",
    "ferry_client/_shm.py",
    "ferry_client/_wire.py",
    "ferry_client/client.py",
    "ferry_client/pipe.py",
    "ferry_client/tensors.py",
]


def note(msg: str) -> None:
    print(f"ferry-client: {msg}", file=sys.stderr)


def ext_modules() -> list[Any]:
    if os.environ.get("FERRY_PURE_PYTHON", "") not in ("", "0"):
        note("FERRY_PURE_PYTHON is set: installing pure Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as e:
        note(f"mypyc is not available ({e}): installing pure Python")
        return []
    try:
        return list(mypycify(COMPILED, opt_level="3", group_name="ferry_client"))
    except (Exception, SystemExit) as e:  # noqa: BLE001 (never fail the install)
        # mypyc reports a failed type check (numpy's stubs missing from the build
        # environment, say) with sys.exit, which `except Exception` does not catch.
        why = (
            "its type check failed, errors above"
            if isinstance(e, SystemExit)
            else f"{type(e).__name__}: {e}"
        )
        note(
            f"mypyc could not compile the modules ({why}): installing pure Python "
            "(it behaves the same; a call costs about a third more)"
        )
        return []


class OptionalBuildExt(build_ext):
    """Builds the compiled modules if it can; otherwise leaves none behind, so that the
    package is wholly interpreted rather than half compiled."""

    def run(self) -> None:
        try:
            super().run()
        except (Exception, SystemExit) as e:  # noqa: BLE001 (no compiler, headers, ...)
            note(f"compiling failed ({type(e).__name__}: {e}): installing pure Python")
            for path in self.get_outputs():
                try:
                    os.remove(path)
                except OSError:
                    pass
            self.extensions = []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
