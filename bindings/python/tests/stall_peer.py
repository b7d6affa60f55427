"""A peer that connects and never reads: `python -m tests.stall_peer ADDR` says `ready` on
stdout once connected, then sleeps until it is killed (or 60 s pass)."""

from __future__ import annotations

import sys
import time

import ferry


def main(addr: str) -> None:
    pipe = ferry.connect(addr)
    print("ready", flush=True)
    time.sleep(60)
    pipe.close()


if __name__ == "__main__":
    main(sys.argv[1])
