"""Socket plumbing shared by both clients: addresses, peer credentials, descriptors."""

from __future__ import annotations

import array
import os
import socket
import struct

from ._wire import MAX_FDS_PER_RECV
from .errors import FerryError, ProtocolError

ANCILLARY = socket.CMSG_SPACE(MAX_FDS_PER_RECV * 4)
"""Room for the most descriptors one recvmsg may carry."""

_CTRUNC = int(socket.MSG_CTRUNC)

MAX_IOV = 512
"""The most buffers handed to one sendmsg (Linux allows 1024)."""


def socket_address(addr: str) -> str:
    """`unix:NAME` -> the abstract name `"\\0NAME"`; `unix:/path` (any REST with a `/`)
    -> the path (PROTOCOL.md section 2)."""
    scheme, sep, rest = addr.partition(":")
    if scheme != "unix" or not sep or not rest:
        raise ValueError(f"expected unix:NAME or unix:/path/to.sock, got {addr!r}")
    if "\0" in rest:
        raise ValueError(f"an address cannot contain NUL bytes: {addr!r}")
    if "/" in rest or "\\" in rest:
        if len(rest.encode()) > 107:
            raise ValueError(f"a socket path has at most 107 bytes: {addr!r}")
        return rest
    if len(rest.encode()) > 100:
        raise ValueError(f"an abstract socket name has at most 100 bytes: {addr!r}")
    return "\0" + rest


def check_peer(sock: socket.socket, allow_any_user: bool) -> None:
    """Refuses a server that runs as another user (unless allowed), as ferry's own
    client does."""
    if allow_any_user or not hasattr(socket, "SO_PEERCRED"):
        return
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    if uid != os.geteuid():
        raise FerryError(
            f"the server runs as uid {uid}, not as this user ({os.geteuid()}); "
            "pass allow_any_user=True to talk to it anyway"
        )


def received_fds(ancdata: list[tuple[int, int, bytes]], flags: int) -> list[int]:
    """The descriptors of one recvmsg's ancillary data, in order."""
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[: len(data) - len(data) % a.itemsize])
            fds.extend(a)
    if flags & _CTRUNC:
        for fd in fds:
            os.close(fd)
        raise ProtocolError("descriptors were truncated (MSG_CTRUNC)")
    return fds


def rights(fds: list[int]) -> list[tuple[int, int, bytes]]:
    """Ancillary data passing `fds` (SCM_RIGHTS)."""
    if not fds:
        return []
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


def advance(parts: list[bytes | memoryview], n: int) -> list[bytes | memoryview]:
    """`parts` without their first `n` bytes."""
    i = 0
    while i < len(parts) and n >= len(parts[i]):
        n -= len(parts[i])
        i += 1
    rest = parts[i:]
    if rest and n:
        rest[0] = memoryview(rest[0])[n:]
    return rest
