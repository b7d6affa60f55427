"""`ConnectOptions`: how a client connects, as one value; and the one place that reads
it: which options a connect uses (`resolve`: its `options`, or its keyword arguments) and
the `Session` they make (`new_session`).

Interpreted, not compiled (setup.py): `ConnectOptions` is a plain dataclass that
applications copy with `dataclasses.replace`, and nothing here is on the path of a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ._cupy import make_driver
from ._session import Session
from ._wire import Limits


@dataclass(frozen=True)
class ConnectOptions:
    """How to connect to a ferry server: what `Client.connect`, `AsyncClient.connect`
    and `Pipe.connect` take besides the address, in one value to keep, share, and change
    with `dataclasses.replace`.

    `Client.connect(addr, options=opts)` connects as `Client.connect(addr,
    timeout=opts.timeout, ...)` does, field for field: the keyword arguments of the same
    names and defaults still work. A keyword argument given with `options` must agree with
    it (or stay at its default, as the generated clients pass `timeout`, `shm` and
    `token` on); one that disagrees is a `TypeError`.
    """

    timeout: float = 60.0
    """Default seconds each call waits for its answer (a `Pipe`: each `recv()` for a
    message)."""
    connect_timeout: float = 10.0
    """Seconds for connecting and the handshake."""
    shm: bool = True
    """Offer shared memory (zero-copy tensors on one Linux host); the server chooses it
    when it can, else tensors travel inline."""
    token: str | None = field(default=None, repr=False)
    """The server's bearer token, if it requires one (left out of `repr`)."""
    agent: str | None = None
    """Free text naming this client in the server's logs (`None`: `ferry-python/VERSION`,
    or `ferry-python-asyncio/VERSION` for `AsyncClient`)."""
    allow_any_user: bool = False
    """Talk to a server running as another user."""
    pool_limit: int = 2 << 30
    """Bytes of shared memory this client may create for sending."""
    max_peer_bytes: int = 16 << 30
    """Bytes of the server's shared memory this client may map."""
    limits: Limits | None = None
    """This side's receive limits, announced to the server (`None`: the defaults)."""
    cuda: bool | None = None
    """Offer the cuda-ipc channel (CUDA tensors without a copy, through CuPy): `None`
    offers it when the application has imported `cupy` and a device is usable; `True`
    requires it (`CudaUnavailable` naming what is missing otherwise); `False` never
    offers it."""
    cuda_pool_limit: int = 4 << 30
    """Bytes of device memory this client may allocate for sending CUDA tensors (per
    connection)."""
    cuda_max_peer_allocs: int = 4096
    """Distinct server allocations this client may map."""
    busy_poll_us: int | None = None
    """Microseconds a waiting read keeps polling the socket before it sleeps: an answer
    within that time is picked up without the sleep and wake-up (~10 µs here, and a
    colder CPU after). `None`: 50 when this process may run on 2 or more CPUs, else 0
    (spinning on one CPU would only delay the server). A call that takes longer costs at
    most this much extra CPU. `Client` and `Pipe` only: `AsyncClient` waits in the event
    loop and ignores it."""


_DEFAULTS = ConnectOptions()


def resolve(options: ConnectOptions | None, keywords: ConnectOptions) -> ConnectOptions:
    """The options a connect uses: `options` when given, else `keywords` (its keyword
    arguments, made into options).

    Raises:
        TypeError: `options` is not a `ConnectOptions`, or a keyword argument is neither
            at its default nor equal to the same field of `options`.
    """
    if options is None:
        return keywords
    if not isinstance(options, ConnectOptions):
        raise TypeError(
            f"options must be a ferry_client.ConnectOptions, got {type(options).__name__}"
        )
    clash = [
        f.name
        for f in fields(ConnectOptions)
        if (given := getattr(keywords, f.name)) != getattr(_DEFAULTS, f.name)
        and given != getattr(options, f.name)
    ]
    if clash:
        raise TypeError(
            f"connect() got options= and keyword arguments that disagree with it: "
            f"{', '.join(clash)}; give each option once (in options, or as a keyword)"
        )
    return options


def new_session(o: ConnectOptions, agent: str) -> Session:
    """The `Session` of a new connection with options `o`; `agent` names the client when
    `o.agent` does not."""
    driver, why = make_driver(o.cuda)
    return Session(
        shm=o.shm,
        token=o.token,
        agent=o.agent or agent,
        limits=o.limits or Limits(),
        pool_limit=o.pool_limit,
        max_peer_bytes=o.max_peer_bytes,
        cuda=driver,
        cuda_unavailable=why,
        cuda_pool_limit=o.cuda_pool_limit,
        cuda_max_peer_allocs=o.cuda_max_peer_allocs,
    )
