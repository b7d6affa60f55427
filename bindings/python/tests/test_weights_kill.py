"""Never a torn model (issue 47 point 4), with real processes killed by SIGKILL while a
version moves: the store's process (the subscriber loses its connection mid-update), the
publisher's (mid-publish), and a subscriber's. Whichever moment the kill lands at, every
survivor holds a whole version, checked bit for bit."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import ferry
import ferry.weights as fw
from tests.conftest import WAIT, unique_addr

N, ELEMS = 16, 1 << 20  # 16 tensors of 4 MiB (f32): big enough to be killed mid-transfer


def version(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"t{i}": rng.standard_normal(ELEMS, dtype=np.float32) for i in range(N)}


def equal(a: dict[str, object], b: dict[str, np.ndarray]) -> bool:
    return set(a) == set(b) and all(np.array_equal(np.asarray(a[k]), b[k]) for k in b)


CHILD = """
import sys, time
import numpy as np
import ferry, ferry.weights as fw
N, ELEMS = {n}, {elems}
def version(seed):
    rng = np.random.default_rng(seed)
    return {{f"t{{i}}": rng.standard_normal(ELEMS, dtype=np.float32) for i in range(N)}}
"""


def child(body: str) -> subprocess.Popen[str]:
    code = CHILD.format(n=N, elems=ELEMS) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def read_line(p: subprocess.Popen[str]) -> str:
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line, f"the child ended early (rc {p.poll()})"
    return line


def kill(p: subprocess.Popen[str]) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(WAIT)


def test_a_subscriber_whose_store_dies_mid_update_keeps_version_n() -> None:
    addr = unique_addr("wkill")
    p = child(
        f"""
        s = ferry.StoreServer({addr!r})
        pub = fw.Publisher(s, "m")
        pub.publish(version(1), version=1)
        print("v1", flush=True)
        time.sleep(0.5)
        pub.publish(version(2), version=2)
        print("v2", flush=True)
        time.sleep(600)
        """
    )
    try:
        assert read_line(p) == "v1"
        sub = fw.subscribe(addr, "m")
        sub.wait_for(1, timeout=WAIT)
        assert read_line(p) == "v2"
        outcome: list[object] = []

        def update() -> None:
            try:
                outcome.append(sub.update(timeout=WAIT))
            except fw.UpdateFailed as e:
                outcome.append(e)

        t = threading.Thread(target=update)
        t.start()
        time.sleep(0.01)  # the delta (every tensor whole: 64 MiB) is on its way
        kill(p)
        t.join(WAIT)
        assert not t.is_alive() and len(outcome) == 1
        if isinstance(outcome[0], fw.UpdateFailed):
            assert outcome[0].version == 1 and sub.version == 1
            assert equal(sub.state_dict(as_torch=False), version(1)), (
                "version 1 torn by a failed update"
            )
        else:
            assert sub.version == 2 and equal(sub.state_dict(as_torch=False), version(2))
        with pytest.raises(fw.UpdateFailed):
            sub.update(timeout=WAIT)
        assert sub.version in (1, 2)
    finally:
        if p.poll() is None:
            kill(p)


def test_a_publisher_killed_mid_publish_leaves_the_previous_version_the_latest() -> None:
    store = ferry.StoreServer(unique_addr("wkill"))
    try:
        p = child(
            f"""
            pub = fw.Publisher({store.addr!r}, "m")
            pub.publish(version(1), version=1)
            v2 = version(2)
            print("v1", flush=True)
            for _ in range(100):
                pub.publish(v2, version=2)
            """
        )
        try:
            assert read_line(p) == "v1"
            kill(p)
        finally:
            if p.poll() is None:
                kill(p)
        sub = fw.subscribe(store.addr, "m")
        sub.update(timeout=WAIT)
        assert sub.version in (1, 2)
        assert equal(sub.state_dict(as_torch=False), version(sub.version or 0))
    finally:
        store.stop()


def test_a_subscriber_killed_mid_update_leaves_the_store_serving_the_others() -> None:
    store = ferry.StoreServer(unique_addr("wkill"))
    try:
        pub = fw.Publisher(store, "m")
        pub.publish(version(1), version=1)
        p = child(
            f"""
            sub = fw.subscribe({store.addr!r}, "m")
            print("go", flush=True)
            sub.update()
            print("done", flush=True)
            time.sleep(600)
            """
        )
        try:
            assert read_line(p) == "go"
            kill(p)
        finally:
            if p.poll() is None:
                kill(p)
        held = fw.subscribe(store.addr, "m")
        held.update(timeout=WAIT)
        view = held.state_dict(as_torch=False)
        pub.publish(version(2), version=2)
        held.update(timeout=WAIT)
        assert equal(view, version(1)), "a reader's version 1 changed under it"
        assert equal(held.state_dict(as_torch=False), version(2))
    finally:
        store.stop()
