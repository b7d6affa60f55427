"""A tensor store hosted by a Python program: `ferry serve-weights` without the command.

```python
import ferry

with ferry.StoreServer("unix:weights", ["model.safetensors"], name="model") as store:
    ...  # readers: ferry.open_weights(store.addr, "model")

ferry.serve_weights("unix:weights", ["model.safetensors"], name="model")  # until Ctrl-C
```
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._native import StoreServer


def serve_weights(
    addr: str = "unix:ferry-weights",
    files: Sequence[str | os.PathLike[str]] = (),
    *,
    name: str | None = None,
    budget_mib: int | None = None,
    bucket_mib: int = 512,
    digest: bool = True,
    placement: str | None = None,
    cpu_budget_mib: int | None = None,
    disk_budget_mib: int | None = None,
    disk_dir: str | os.PathLike[str] | None = None,
    token: str | None = None,
    max_connections: int = 512,
    announce: bool = True,
    delta_bases: int = 1,
) -> None:
    """Publishes `files` (`.safetensors`) as bundle `name` and serves the store on `addr`
    until interrupted (KeyboardInterrupt stops it and is raised), as `ferry serve-weights`
    does. The options are the command's (`ferry serve-weights --help`); `announce` prints
    `listening on ADDR`. For a store served beside other work, use `StoreServer`."""
    server = StoreServer(
        addr,
        list(files),
        name=name,
        budget_mib=budget_mib,
        bucket_mib=bucket_mib,
        digest=digest,
        placement=placement,
        cpu_budget_mib=cpu_budget_mib,
        disk_budget_mib=disk_budget_mib,
        disk_dir=disk_dir,
        token=token,
        max_connections=max_connections,
        announce=announce,
        delta_bases=delta_bases,
    )
    try:
        server.wait()
    finally:
        server.stop()


__all__ = ["StoreServer", "serve_weights"]
