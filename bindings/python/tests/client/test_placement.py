"""Tensor references placed in a store's tiers, from Python, against a real
`ferry serve-weights --placement` process: a reference's placement is visible and
settable, the store's policy and budgets are read and set, a fetched array is never
changed under its reader while the reference moves, errors are typed and name the option,
and the MLP example runs a model larger than the cpu tier with the layer schedule."""

from __future__ import annotations

import gc
import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import numpy.typing as npt
import pytest

from ferry import Client
from ferry.errors import ResultError
from ferry.placement import (
    DeviceTier,
    StorePlacement,
    place,
    placement,
    schedule,
    set_store_placement,
    store_placement,
    wait_placed,
)
from ferry.refs import TensorRef, fetch, free, keep
from ferry.rpc_errors import (
    InvalidParamsError,
    LimitExceededError,
    NotFoundError,
)
from tests.client.servers import Server, ferry_bin, unique_addr

MIB = 1 << 20
EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "python" / "placement_mlp.py"


def store(policy: str | None, disk: Path, cpu_mib: int = 3) -> Server:
    """`ferry serve-weights` with no checkpoint, placing references by `policy`."""
    argv = ["serve-weights", "--name", "m"]
    if policy is not None:
        argv += ["--placement", policy, "--cpu-budget-mib", str(cpu_mib)]
        argv += ["--disk-dir", str(disk), "--disk-budget-mib", "64"]
    return Server("weights", unique_addr("placement"), [*argv, "--addr"])


@pytest.fixture
def lru(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    s = store("lru", tmp_path)
    try:
        yield s, tmp_path
    finally:
        s.kill()


def layer(v: float) -> npt.NDArray[np.float32]:
    """A 1 MiB float32 array of `v`."""
    return np.full(MIB // 4, v, dtype=np.float32)


def until_let_go(c: Client, r: TensorRef, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while placement(c, r).in_use:
        if time.monotonic() > deadline:
            pytest.fail(f"reference {r.id} still in use after {timeout} s")
        gc.collect()
        time.sleep(0.01)


def test_placement_is_visible_and_a_reader_is_never_moved_under(
    lru: tuple[Server, Path],
) -> None:
    server, disk = lru
    with Client.connect(server.addr) as c:
        refs = [keep(c, layer(i)) for i in range(6)]
        where = [wait_placed(c, r).placement for r in refs]
        assert where == ["disk"] * 3 + ["cpu"] * 3, "LRU keeps the last three MiB"
        info = store_placement(c)
        assert (info.tiers, info.policy, info.cpu_budget_bytes) == (
            True,
            "lru",
            3 * MIB,
        )
        assert (info.cpu_used_bytes, info.disk_used_bytes) == (3 * MIB, 6 * MIB)
        assert info.disk_dir == str(disk)
        assert len(list(disk.iterdir())) == 3, "one file per reference on disk"
        # A reader maps one from disk: read in, lent over shm (no copy on the client).
        a = fetch(c, refs[0])
        assert not a.flags.writeable and np.all(a == 0.0)
        assert placement(c, refs[0]).placement == "cpu"
        # Other uses make the policy let it go: it stays in the cpu tier while the
        # reader's array lives (the move deferred), the array unchanged.
        for r in refs[3:]:
            fetch(c, r)
        p = wait_placed(c, refs[0])
        assert (p.placement, p.in_use, p.deferred) == ("cpu", True, True)
        stats = store_placement(c).stats
        assert stats is not None and stats.held_over_bytes == MIB
        assert np.all(a == 0.0)
        del a
        until_let_go(c, refs[0])
        # Let go: it went down.
        p = placement(c, refs[0])
        assert (p.placement, p.deferred) == ("disk", False)
        # Every one comes back intact.
        for i, r in enumerate(refs):
            assert np.all(fetch(c, r) == float(i)), i
        stats = store_placement(c).stats
        assert stats is not None and stats.uses >= 10 and stats.bytes_written > 0
        # Freed: its file goes.
        files = len(list(disk.iterdir()))
        assert free(c, refs[1]) == 1
        assert len(list(disk.iterdir())) == files - 1
        with pytest.raises(NotFoundError):
            placement(c, refs[1])


def let_go(c: Client, ref: TensorRef) -> None:
    """Waits until nothing holds `ref` in use: the arrays `fetch` returned are gone, and
    their leases go back from the Rust client's runtime a moment later (a reference in
    use is never moved)."""
    deadline = time.monotonic() + 30
    while placement(c, ref).in_use:
        assert time.monotonic() < deadline, f"{ref.id} still in use 30 s after its arrays died"
        time.sleep(0.01)


def test_placed_by_hand_and_reconfigured_with_errors_naming_options(
    lru: tuple[Server, Path],
) -> None:
    server, _ = lru
    with Client.connect(server.addr) as c:
        refs = [keep(c, layer(i)) for i in range(5)]
        p = place(c, refs[0], "cpu")
        assert (p.placement, p.pinned) == ("cpu", "cpu")
        assert wait_placed(c, refs[0]).placement == "cpu"
        for r in refs[1:]:
            fetch(c, r)
        assert placement(c, refs[0]).placement == "cpu", "pinned: the policy keeps off"
        let_go(c, refs[4])
        p = place(c, refs[4], "disk")
        assert (p.placement, p.pinned) == ("disk", "disk")
        assert np.all(fetch(c, refs[4]) == 4.0)
        let_go(c, refs[4])
        assert wait_placed(c, refs[4]).placement == "disk"
        place(c, refs[1], "cpu")
        place(c, refs[2], "cpu")
        with pytest.raises(LimitExceededError) as e:
            place(c, refs[3], "cpu")
        assert "cpu_budget_bytes" in e.value.message
        with pytest.raises(InvalidParamsError):
            place(c, refs[3], "gpu")
        # No device tier on this store: its placement and budget are refused by name.
        assert store_placement(c).device is None
        with pytest.raises(InvalidParamsError) as e3:
            place(c, refs[3], "cuda:0")
        assert "cpu, disk or auto" in e3.value.message
        with pytest.raises(InvalidParamsError) as e3:
            set_store_placement(c, device_budget_bytes=MIB)
        assert "device_budget_bytes" in e3.value.message
        with pytest.raises(InvalidParamsError) as e2:
            set_store_placement(c, policy="nope")
        assert "policy" in e2.value.message
        with pytest.raises(LimitExceededError) as e:
            set_store_placement(c, disk_budget_bytes=1)
        assert "disk_budget_bytes" in e.value.message
        with pytest.raises(LimitExceededError) as e:
            set_store_placement(c, cpu_budget_bytes=MIB)
        assert "cpu_budget_bytes" in e.value.message
        for r in refs:
            place(c, r, "auto")
        info = set_store_placement(c, policy="flow", cpu_budget_bytes=4 * MIB)
        assert (info.policy, info.cpu_budget_bytes) == ("flow", 4 * MIB)
        assert schedule(c, refs * 2) == 10
        before = store_placement(c).stats
        for r in refs * 2:
            fetch(c, r)
        after = store_placement(c).stats
        assert before is not None and after is not None
        assert after.hits - before.hits >= 9, "the schedule prefetches all but the first"
        with pytest.raises(NotFoundError):
            schedule(c, [TensorRef("r0123", "f32", (1,))])


def test_a_store_without_placement_keeps_references_in_memory(tmp_path: Path) -> None:
    s = store(None, tmp_path)
    try:
        with Client.connect(s.addr) as c:
            r = keep(c, layer(2.0))
            info = store_placement(c)
            assert (info.tiers, info.policy, info.stats) == (False, "pinned", None)
            assert placement(c, r).placement == "cpu"
            assert schedule(c, [r]) == 0
            with pytest.raises(InvalidParamsError) as e:
                place(c, r, "disk")
            assert "--placement" in e.value.message
            with pytest.raises(InvalidParamsError):
                set_store_placement(c, policy="lru")
    finally:
        s.kill()


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("placement_mlp", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["placement_mlp"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_mlp_example_runs_larger_than_the_cpu_tier_with_its_schedule(
    tmp_path: Path,
) -> None:
    mlp = load_example()
    s = store("flow", tmp_path, cpu_mib=3)
    try:
        with Client.connect(s.addr) as c:
            # 6 layers of 1 MiB, 3 MiB of cpu tier, 3 passes.
            rows = mlp.example(c, layers=6, hidden=512, batch=8, passes=3)
            assert not store_placement(c).cpu_used_bytes, "the example frees its layers"
    finally:
        s.kill()
    lru, flow = rows
    assert lru.exact and flow.exact, "the same numbers as the in-memory MLP"
    assert (lru.policy, lru.scheduled, flow.policy, flow.scheduled) == (
        "lru",
        False,
        "flow",
        True,
    )
    assert lru.uses == flow.uses == 18
    assert lru.hits == 0, "a cyclic pass over more than fits: LRU's worst case"
    assert flow.hits >= 17, "with the schedule every layer but the first is placed ahead"


def test_the_example_runs_as_a_script_and_starts_its_own_store(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FERRY_BIN", ferry_bin())
    mlp = load_example()
    args = ["--layers", "4", "--hidden", "512", "--batch", "4", "--passes", "2"]
    assert mlp.main([*args, "--cpu-budget-mib", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 layers of 1.0 MiB (4 MiB), cpu tier 2 MiB" in out, out
    assert "flow + schedule" in out and "False" not in out, out


def test_the_example_records_the_stores_uses_as_a_trace(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """`--record-trace FILE`: the store it starts (`ferry serve-weights --record-trace`)
    writes one JSON line per use its policy sees: each layer's keep, then every fetch in
    order, with the layer's bytes (the format `cargo xtask placement-bench --trace`
    replays)."""
    monkeypatch.setenv("FERRY_BIN", ferry_bin())
    mlp = load_example()
    trace = tmp_path / "mlp.jsonl"
    args = ["--layers", "4", "--hidden", "512", "--batch", "4", "--passes", "2"]
    assert mlp.main([*args, "--cpu-budget-mib", "2", "--record-trace", str(trace)]) == 0
    capsys.readouterr()
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert all(set(u) == {"key", "bytes"} for u in lines), lines[:3]
    assert all(u["bytes"] == MIB for u in lines), "a 512x512 float32 layer each"
    keys = [u["key"] for u in lines]
    layers = keys[:4]
    assert len(set(layers)) == 4, "the 4 keeps first, one key per layer"
    # Then 2 runs (lru, flow) of 2 passes over the layers in order.
    assert keys[4:] == layers * 4, keys


def test_a_device_tier_is_read_from_the_stores_answer() -> None:
    # `store.placement.get` as a store with a device tier answered it (recorded from
    # store/tests/placed_device.rs, which runs the tier on a simulated GPU: no GPU here).
    answer = json.loads(
        """{"cpu_budget_bytes": 262144, "cpu_used_bytes": 262144, "device": {
        "budget_bytes": 524288, "device": "cuda:0", "policy": "lru", "stats": {
        "bytes_down": 524288, "bytes_up": 0, "deferred": 0, "held_over_bytes": 0,
        "hits": 0, "last_error": null, "prefetches": 0, "stalled_ms": 0.0, "uses": 0,
        "waits": 0}, "used_bytes": 524288}, "disk_budget_bytes": 67108864,
        "disk_dir": "/tmp/x", "disk_used_bytes": 524288, "policy": "lru", "stats": {
        "bytes_read": 0, "bytes_written": 262144, "deferred": 0, "held_over_bytes": 0,
        "hits": 0, "last_error": null, "prefetches": 0, "stalled_ms": 0.0, "uses": 0,
        "waits": 0}, "tiers": true}"""
    )
    info = StorePlacement.from_json(answer, "store.placement.get")
    assert info.device == DeviceTier(
        device="cuda:0",
        policy="lru",
        budget_bytes=512 << 10,
        used_bytes=512 << 10,
        uses=0,
        hits=0,
        waits=0,
        bytes_up=0,
        bytes_down=512 << 10,
        prefetches=0,
        stalled_ms=0.0,
        last_error=None,
        deferred=0,
        held_over_bytes=0,
    )
    answer["device"]["stats"]["bytes_up"] = "many"
    with pytest.raises(ResultError):
        StorePlacement.from_json(answer, "store.placement.get")
