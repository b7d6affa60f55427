"""The child process of `ferry.spawn`: `python -m ferry._child MODULE ATTR ADDR OPTIONS FD
PARENT` serves the app and reports `["ready", addresses]` (or `["error", text]`) as a JSON
line on the file descriptor FD."""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
from typing import Any

from ._app import App, _import_app
from ._spawn import _die_with_parent


def _child_main(argv: list[str]) -> None:
    """Serves the app named by `argv` and reports on its FD."""
    module, attr, addr, options_json, fd, parent = argv
    _die_with_parent(int(parent))
    out = os.fdopen(int(fd), "w")

    def tell(kind: str, payload: Any) -> None:
        out.write(json.dumps([kind, payload]) + "\n")
        out.flush()

    try:
        if module.endswith(".py"):  # the parent's __main__: run the file, not its main block
            namespace = runpy.run_path(module, run_name="__ferry_spawn__")
            app = namespace.get(attr)
            if not isinstance(app, App):
                raise TypeError(f"{module}: {attr} is not a ferry.App")
        else:
            app = _import_app(module, attr)
        app.serve(
            addr,
            announce=False,
            ready=lambda addrs: tell("ready", addrs),
            **json.loads(options_json),
        )
    except BaseException as e:
        with contextlib.suppress(Exception):
            tell("error", f"{type(e).__qualname__}: {e}")
        raise


if __name__ == "__main__":
    _child_main(sys.argv[1:])
