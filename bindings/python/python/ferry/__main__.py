"""The `ferry` command (installed by the package; also `python -m ferry`).

- `ferry serve MODULE:APP [ADDR ...]`: serve a Python app (a `ferry.App`), with `ferry
  serve`'s options (`--help` after `serve MODULE:APP` lists them).
- Every other command line is the Rust `ferry` binary's, run by the native module in this
  process: `ferry serve [ADDR]` (the demo or conformance API), `call`, `discover`, `sdk`,
  `serve-weights`, `bench`, `info` (`ferry --help`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from ._app import App


def _load(spec: str, app_dir: str = ".") -> App:
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise SystemExit(f"ferry: {spec!r}: give the app as MODULE:ATTRIBUTE (e.g. mymodule:app)")
    if not os.path.isdir(app_dir):
        raise SystemExit(f"ferry: --app-dir {app_dir!r} is not a directory")
    sys.path.insert(0, os.path.abspath(app_dir))
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise SystemExit(f"ferry: cannot import {module!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"ferry: {module!r} has no attribute {attr!r}") from None
    if not isinstance(obj, App):
        raise SystemExit(f"ferry: {spec} is a {type(obj).__qualname__}, not a ferry.App")
    return obj


_ADDRESS_SCHEMES = ("unix", "quic", "http", "https", "tcp")
"""What comes before `:` in an address: `ferry serve unix:demo` serves the demo API."""


def _serves_app(argv: list[str]) -> bool:
    """Whether `argv` serves a Python app: `serve`, then an argument MODULE:ATTRIBUTE
    (dotted names, MODULE not an address scheme), or a first argument that is neither an
    option nor an address (what should have been MODULE:ATTRIBUTE: `main` says so). The
    rest (`ferry serve [ADDR] --api conformance ...`) is the native `ferry serve`."""
    if not argv or argv[0] != "serve":
        return False
    for a in argv[1:]:
        module, sep, attr = a.partition(":")
        if (
            sep
            and module not in _ADDRESS_SCHEMES
            and _DOTTED.fullmatch(module)
            and _DOTTED.fullmatch(attr)
        ):
            return True
    first = argv[1] if len(argv) > 1 else "-"
    scheme, sep, _ = first.partition(":")
    return not first.startswith("-") and not (sep and scheme in _ADDRESS_SCHEMES)


_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _native_command(argv: list[str]) -> int:
    """The Rust `ferry` command line, in this process (its peers: `python -m ferry`).

    SIGINT gets its default action back first, as the Rust binary has it: Ctrl-C ends a
    `call` at once, and a server (`serve`, `serve-weights`) installs its own handler and
    stops cleanly (status 0). Python's handler would instead raise KeyboardInterrupt once
    the command returned, and the interpreter would then end itself by SIGINT."""
    import signal

    from ._native import main as native_main

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return native_main(["ferry", *argv], sys.executable, ["-m", "ferry"])


def main(argv: list[str] | None = None) -> int:
    """`ferry serve MODULE:APP ...` (a Python app; `python -m ferry serve MODULE:APP --help`)."""
    p = argparse.ArgumentParser(prog="ferry", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve an app (MODULE:APP) on one or more addresses")
    s.add_argument("app", help="the app, as MODULE:ATTRIBUTE (uvicorn's convention)")
    s.add_argument(
        "addrs",
        nargs="*",
        help="addresses (default unix:APP_NAME): unix:NAME, a socket path, quic://HOST:PORT",
    )
    s.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="import the app's module from this directory (default: the current one)",
    )
    s.add_argument("--http", metavar="HOST:PORT", help="also serve JSON-RPC over HTTP POST")
    s.add_argument(
        "--token",
        default=os.environ.get("FERRY_TOKEN"),
        help="require this bearer token (default: $FERRY_TOKEN)",
    )
    s.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback QUIC/HTTP address without a token",
    )
    s.add_argument(
        "--http-allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed over HTTP (repeatable)",
    )
    s.add_argument(
        "--http-allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="an extra Host accepted over HTTP (repeatable)",
    )
    s.add_argument(
        "--shm-pool-mib",
        type=int,
        metavar="MIB",
        help="shared memory per connection for results (default 2048)",
    )
    s.add_argument(
        "--busy-poll-us",
        type=int,
        metavar="US",
        help="µs a connection polls for the next request after an answer",
    )
    s.add_argument(
        "--max-connections",
        type=int,
        default=512,
        metavar="N",
        help="connections served at once (default 512)",
    )
    s.add_argument("--max-in-flight", type=int, metavar="N", help="calls in flight per connection")
    s.add_argument("--max-tasks", type=int, metavar="N", help="tasks held at once")
    s.add_argument(
        "--max-queued-answers",
        type=int,
        metavar="N",
        help="answers per connection not yet written before it is no longer read (default 256)",
    )
    s.add_argument("--max-refs", type=int, metavar="N", help="tensor references held at once")
    s.add_argument(
        "--max-ref-mib", type=int, metavar="MIB", help="bytes of tensor references held at once"
    )
    s.add_argument(
        "--max-running-handlers",
        type=int,
        metavar="N",
        help="sync handlers running at once, cancelled ones included (default 256)",
    )
    s.add_argument(
        "--max-queued-handlers",
        type=int,
        metavar="N",
        help="calls waiting for a sync handler thread (default 1024)",
    )
    s.add_argument(
        "--max-param-bytes-in-flight",
        type=int,
        metavar="BYTES",
        help="bytes of JSON params held by handlers at once (default 16 MiB)",
    )
    s.add_argument(
        "--debug",
        action="store_true",
        help="internal errors carry the handler's traceback",
    )
    a = p.parse_args(argv)
    app = _load(a.app, a.app_dir)
    if a.debug:
        app.debug = True
    app.serve(
        *a.addrs,
        http=a.http,
        token=a.token,
        allow_unauthenticated=a.allow_unauthenticated,
        http_allow_origin=a.http_allow_origin,
        http_allow_host=a.http_allow_host,
        shm_pool_mib=a.shm_pool_mib,
        busy_poll_us=a.busy_poll_us,
        max_connections=a.max_connections,
        max_in_flight=a.max_in_flight,
        max_tasks=a.max_tasks,
        max_queued_answers=a.max_queued_answers,
        max_refs=a.max_refs,
        max_ref_bytes=None if a.max_ref_mib is None else a.max_ref_mib << 20,
        max_running_handlers=a.max_running_handlers,
        max_queued_handlers=a.max_queued_handlers,
        max_param_bytes_in_flight=a.max_param_bytes_in_flight,
    )
    return 0


def _run(argv: list[str] | None = None) -> int:
    """`main` as the command line runs it: a server that cannot start (an address already
    in use, a bad option) ends with one line saying why and what to do, not a traceback
    (`--debug` keeps it). A command line that does not serve a Python app goes to the native
    command (`ferry --help`)."""
    args = sys.argv[1:] if argv is None else argv
    if not _serves_app(args):
        return _native_command(args)
    try:
        return main(argv)
    except RuntimeError as e:
        if "--debug" in args:
            raise
        msg = str(e)
        if "in use" in msg:
            msg += (
                ": another server is listening there; stop it, or serve on another "
                "address (ferry serve MODULE:APP unix:OTHER_NAME)"
            )
        print(f"ferry: {msg}", file=sys.stderr)
        return 1


def console() -> None:
    """The installed `ferry` command (`[project.scripts]`)."""
    sys.exit(_run())


if __name__ == "__main__":
    console()
