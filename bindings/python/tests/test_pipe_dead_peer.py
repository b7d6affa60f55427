"""A `Pipe.send` whose peer stops reading (issue 43, point 1): a real peer process that
never reads, then SIGKILL. The send fails with `BrokenPipeError` instead of waiting for
ever; `send(timeout=...)` gives up with `TimeoutError` and leaves the pipe open; `close()`
from another thread does not wait for a stuck send; nothing is left behind."""

from __future__ import annotations

import gc
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest

import ferry
from tests.conftest import ROOT, WAIT, unique_addr, wait_until

MAX_FILL = 100_000
"""Most messages a fill may take before the peer's buffers are full (never reached)."""


def held() -> tuple[int, int]:
    """This process's open descriptors and ring mappings."""
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/maps") as f:
        rings = sum("memfd:ferry-ring" in line for line in f)
    return fds, rings


def start_stalled() -> tuple[ferry.Pipe, subprocess.Popen[str]]:
    """A pipe to a new peer process that never reads, and the process (the listener is
    let go once the peer is accepted)."""
    listener = ferry.listen(unique_addr("stall"))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.stall_peer", listener.address],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pipe = listener.accept(timeout=WAIT)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    except BaseException:
        child.kill()
        child.wait()
        raise
    return pipe, child


@pytest.fixture
def stalled() -> Iterator[tuple[ferry.Pipe, subprocess.Popen[str]]]:
    """A pipe to a peer process that never reads, and the process."""
    pipe, child = start_stalled()
    try:
        yield pipe, child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def fill(pipe: ferry.Pipe) -> None:
    """Sends with a short deadline until one times out: the peer's buffers are full."""
    x = np.arange(16, dtype=np.float32)
    for i in range(MAX_FILL):
        try:
            pipe.send({"i": i}, [x], timeout=0.05)
        except TimeoutError as e:
            assert "nothing was sent" in str(e), e
            assert not pipe.closed, "a send that timed out closed the pipe"
            return
    raise AssertionError("the peer's buffers never filled")


def blocked_send(pipe: ferry.Pipe) -> queue.Queue[BaseException | None]:
    """A send with no deadline on another thread; its outcome comes on the queue (after
    the thread let go of the pipe)."""
    out: queue.Queue[BaseException | None] = queue.Queue()

    def run(p: list[ferry.Pipe]) -> None:
        outcome: BaseException | None = None
        try:
            p[0].send({"stuck": True})
        except BaseException as e:  # the outcome is the test's to judge
            outcome = e.with_traceback(None)
        p.clear()
        out.put(outcome)

    threading.Thread(target=run, args=([pipe],), daemon=True).start()
    return out


def test_sigkill_of_a_peer_that_does_not_read_fails_a_blocked_send(
    stalled: tuple[ferry.Pipe, subprocess.Popen[str]],
) -> None:
    pipe, child = stalled
    fill(pipe)
    outcome = blocked_send(pipe)
    with pytest.raises(queue.Empty):
        outcome.get(timeout=0.2)  # it waits for a peer that does not read
    child.kill()
    child.wait()
    err = outcome.get(timeout=WAIT)
    assert isinstance(err, BrokenPipeError), repr(err)
    assert isinstance(err, ConnectionError)
    assert "the peer is gone" in str(err)
    assert pipe.closed
    with pytest.raises(BrokenPipeError):
        pipe.send({"after": True})


def test_a_send_with_a_timeout_gives_up_and_the_pipe_stays_open(
    stalled: tuple[ferry.Pipe, subprocess.Popen[str]],
) -> None:
    pipe, _ = stalled
    fill(pipe)
    with pytest.raises(TimeoutError, match=r"send\(timeout=0.05\)"):
        pipe.send({"late": True}, timeout=0.05)
    assert not pipe.closed
    with pytest.raises(ValueError, match="timeout"):
        pipe.send({}, timeout=-1)


def test_close_from_another_thread_does_not_wait_for_a_stuck_send(
    stalled: tuple[ferry.Pipe, subprocess.Popen[str]],
) -> None:
    pipe, _ = stalled
    fill(pipe)
    outcome = blocked_send(pipe)
    with pytest.raises(queue.Empty):
        outcome.get(timeout=0.2)
    closer = threading.Thread(target=pipe.close, daemon=True)
    closer.start()
    closer.join(WAIT)
    assert not closer.is_alive(), "close() waited for the stuck send"
    err = outcome.get(timeout=WAIT)
    assert isinstance(err, ConnectionError), repr(err)
    assert pipe.closed


def test_nothing_is_left_after_a_killed_peer() -> None:
    gc.collect()
    before = held()
    pipe, child = start_stalled()
    fill(pipe)
    outcome = blocked_send(pipe)
    child.kill()
    child.wait()
    assert child.stdout is not None
    child.stdout.close()
    assert isinstance(outcome.get(timeout=WAIT), BrokenPipeError)
    del pipe, outcome

    def back() -> bool:
        # At most as many as before: what earlier tests left for the collector may go too.
        gc.collect()
        now = held()
        return now[0] <= before[0] and now[1] <= before[1]

    wait_until(back, f"descriptors and ring mappings back to at most {before}")
