"""The other end of the pipe tests: `python -m tests.pipe_peer ADDR` connects to ADDR and
answers each message by its header's `op`, until `bye`."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import ferry
from tests.apps import mapping_of


def describe(ts: list[np.ndarray]) -> dict[str, Any]:
    return {
        "dtypes": [str(t.dtype) for t in ts],
        "shapes": [list(t.shape) for t in ts],
        "writeable": [bool(t.flags.writeable) for t in ts],
        "mappings": [mapping_of(t) for t in ts],
        "sums": [float(t.sum(dtype=np.float64)) for t in ts],
    }


def main(addr: str) -> None:
    pipe = ferry.connect(addr)
    held: list[np.ndarray] = []
    sent: list[np.ndarray] = []
    while True:
        header, ts = pipe.recv(timeout=60)
        op = header["op"]
        if op == "scale":
            outs = []
            for t in ts:
                out = pipe.alloc(t.shape, t.dtype)  # sent without a copy
                np.multiply(t, header["k"], out=out)
                outs.append(out)
            sent.extend(outs)
            pipe.send({"op": "scaled", "got": describe(ts), "echo": header.get("note")}, outs)
        elif op == "hold":
            held.extend(ts)
            pipe.send({"op": "held", "first": [float(t.flat[0]) for t in held]})
        elif op == "peek":
            pipe.send({"op": "peeked", "first": [float(t.flat[0]) for t in held]})
        elif op == "poke_sent":
            for out in sent:
                out[...] = header["value"]
            pipe.send({"op": "poked"})
        elif op == "echo":
            pipe.send({"op": "echoed"}, ts)
        elif op == "bye":
            pipe.send({"op": "bye"})
            return
        else:
            pipe.send({"op": "unknown", "what": op})


if __name__ == "__main__":
    main(sys.argv[1])
