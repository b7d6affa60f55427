"""Weight sync (`ferry.weights`, issue 47): a publisher, subscribers moving by deltas,
`apply_to` in place and all or nothing, a store's per-connection delta counts. Real
stores (`ferry.StoreServer`) on loopback (unix and QUIC); small sizes; no timing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ferry
import ferry.weights as fw
from tests.conftest import WAIT, unique_addr

torch = pytest.importorskip("torch")


@pytest.fixture
def store() -> Iterator[ferry.StoreServer]:
    s = ferry.StoreServer(unique_addr("weights"))
    try:
        yield s
    finally:
        s.stop()


def make_state(seed: int = 0) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w.bf16": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "w.f16": torch.randn(32, 32, generator=g).to(torch.float16),
        "w.f32": torch.randn(128, generator=g),
        "w.f8": torch.randn(256, generator=g).to(torch.float8_e4m3fn),
        "np.f32": np.arange(100, dtype=np.float32),
    }


def step(state: dict[str, object], frac: float, seed: int) -> dict[str, object]:
    """A training step: a fraction of the elements of every tensor changed at random."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, object] = {}
    for n, t in state.items():
        if isinstance(t, np.ndarray):
            a = t.copy()
            k = max(1, int(a.size * frac))
            idx = torch.randperm(a.size, generator=g)[:k].numpy()
            a.reshape(-1)[idx] += 1.0
            out[n] = a
        else:
            assert isinstance(t, torch.Tensor)
            b = t.clone()
            flat = b.view(torch.uint8) if b.element_size() == 1 else b.view(-1)
            k = max(1, int(b.numel() * frac))
            idx = torch.randperm(b.numel(), generator=g)[:k]
            if b.element_size() == 1:
                flat.view(-1)[idx] ^= 1
            else:
                flat[idx] = flat[idx] + 1
            out[n] = b
    return out


def bits(x: object) -> bytes:
    if isinstance(x, np.ndarray):
        return x.tobytes()
    assert isinstance(x, torch.Tensor)
    return bytes(x.contiguous().view(torch.uint8).numpy().tobytes())


def same(a: dict[str, object], b: dict[str, object]) -> bool:
    return set(a) == set(b) and all(bits(a[n]) == bits(b[n]) for n in a)


def test_a_subscriber_gets_each_version_bit_exact_and_then_only_the_changed_elements(
    store: ferry.StoreServer,
) -> None:
    pub = fw.Publisher(store, "policy")
    sub = fw.subscribe(store.addr, "policy")
    v1 = make_state()
    pub.publish(v1, version=10)
    assert sub.wait_for(10, timeout=WAIT) == 10
    assert same(sub.state_dict(), v1)
    v2 = step(v1, 0.01, 1)
    pub.publish(v2, version=11)
    got = sub._update(None, WAIT)
    assert got["sparse"] == len(v2), got  # every tensor changed in 1% of its elements
    assert got["sent_bytes"] < got["full_bytes"] // 3, got
    assert sub.version == 11 and same(sub.state_dict(as_torch=False), v2)


def test_publish_with_changed_sends_only_those_and_keeps_the_rest(store: ferry.StoreServer) -> None:
    pub = fw.Publisher(store, "m")
    v1 = make_state()
    pub.publish(v1, version=1)
    v2 = dict(v1)
    v2["w.f32"] = torch.zeros(128)
    pub.publish({"w.f32": v2["w.f32"]}, version=2, changed=["w.f32"])
    sub = fw.subscribe(store.addr, "m")
    sub.wait_for(2, timeout=WAIT)
    assert same(sub.state_dict(), v2)


def test_readers_of_a_version_keep_it_while_they_hold_it(store: ferry.StoreServer) -> None:
    pub = fw.Publisher(store, "m")
    sub = fw.subscribe(store.addr, "m")
    v1 = make_state()
    pub.publish(v1, version=1)
    sub.wait_for(1, timeout=WAIT)
    held = sub.state_dict()
    pub.publish(step(v1, 0.05, 2), version=2)
    sub.wait_for(2, timeout=WAIT)
    assert same(held, v1), "a view of version 1 changed under its reader"


Module: Any = torch.nn.Module


class Net(Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 8).to(torch.bfloat16)
        self.register_buffer("scale", torch.ones(8))


def test_apply_to_writes_in_place_keeping_every_storage(store: ferry.StoreServer) -> None:
    src = Net()
    pub = fw.Publisher(store, "net")
    sub = fw.subscribe(store.addr, "net")
    model = Net()
    ptrs = {n: t.data_ptr() for n, t in model.state_dict(keep_vars=True).items()}
    v1 = {n: t.detach().clone() for n, t in src.state_dict().items()}
    pub.publish(v1, version=1)
    sub.wait_for(1, timeout=WAIT)
    assert sub.apply_to(model) == 1
    assert same({n: t.detach() for n, t in model.state_dict().items()}, v1)
    v2 = step(v1, 0.05, 3)
    pub.publish(v2, version=2)
    sub.wait_for(2, timeout=WAIT)
    assert sub.apply_to(model) == 2
    assert same({n: t.detach() for n, t in model.state_dict().items()}, v2)
    assert {n: t.data_ptr() for n, t in model.state_dict(keep_vars=True).items()} == ptrs


@pytest.mark.parametrize("bad", ["shape", "dtype", "extra", "missing"])
def test_apply_to_refuses_a_model_that_does_not_match_naming_the_tensor(
    store: ferry.StoreServer, bad: str
) -> None:
    pub = fw.Publisher(store, "net")
    v1 = {"a": torch.ones(4), "b": torch.ones(3, dtype=torch.bfloat16)}
    pub.publish(v1, version=1)
    sub = fw.subscribe(store.addr, "net")
    sub.wait_for(1, timeout=WAIT)
    model = {"a": torch.zeros(4), "b": torch.zeros(3, dtype=torch.bfloat16)}
    if bad == "shape":
        model["b"] = torch.zeros(4, dtype=torch.bfloat16)
    elif bad == "dtype":
        model["b"] = torch.zeros(3, dtype=torch.float16)
    elif bad == "extra":
        model["c"] = torch.zeros(1)
    else:
        del model["b"]
    with pytest.raises(fw.ModelMismatch) as e:
        sub.apply_to(model)
    assert e.value.tensor == ("c" if bad == "extra" else "b")
    assert torch.equal(model["a"], torch.zeros(4)), "a parameter was written before the refusal"


def test_weights_over_quic_with_a_pinned_certificate_and_a_token() -> None:
    s = ferry.StoreServer("quic://127.0.0.1:0", token="sekrit")
    try:
        assert s.addr.startswith("quic://") and "#sha256=" in s.addr
        pub = fw.Publisher(s.addr, "m", token="sekrit")
        sub = fw.subscribe(s.addr, "m", token="sekrit")
        v1 = make_state()
        pub.publish(v1, version=5)
        sub.wait_for(5, timeout=WAIT)
        assert same(sub.state_dict(), v1)
        v2 = step(v1, 0.01, 4)
        pub.publish(v2, version=6)
        sub.wait_for(6, timeout=WAIT)
        assert same(sub.state_dict(), v2)
        with pytest.raises(ferry.Refused):
            fw.subscribe(s.addr, "m", token="wrong")
    finally:
        s.stop()


def test_each_subscriber_is_sent_each_delta_once(store: ferry.StoreServer) -> None:
    pub = fw.Publisher(store, "m")
    subs = [fw.subscribe(store.addr, "m") for _ in range(3)]
    v1 = make_state()
    pub.publish(v1, version=1)
    for s in subs:
        s.wait_for(1, timeout=WAIT)
    v2 = step(v1, 0.01, 5)
    pub.publish(v2, version=2)
    sent = [s._update(None, WAIT)["sent_bytes"] for s in subs]
    assert len(set(sent)) == 1, sent
    stats = subs[0].store_stats()
    assert len(stats) == 3, stats
    full = sum(bits(t).__len__() for t in v1.values())
    for st in stats:
        # Per connection: the first version whole, then the delta once, nothing else.
        assert st["deltas"] == 2, st
        assert st["sent_bytes"] == full + sent[0], (st, full, sent)


def test_a_subscriber_that_cannot_update_keeps_its_version_and_says_so(
    store: ferry.StoreServer,
) -> None:
    pub = fw.Publisher(store, "m")
    sub = fw.subscribe(store.addr, "m")
    v1 = make_state()
    pub.publish(v1, version=1)
    sub.wait_for(1, timeout=WAIT)
    pub.publish(step(v1, 0.01, 6), version=2)
    store.stop()
    with pytest.raises(fw.UpdateFailed) as e:
        sub.wait_for(2, timeout=WAIT)
    assert e.value.version == 1 and sub.version == 1
    assert isinstance(e.value.__cause__, ferry.FerryError)
    assert same(sub.state_dict(), v1)


def test_a_publisher_in_the_store_process_keeps_unchanged_tensors_and_copies_the_rest(
    store: ferry.StoreServer,
) -> None:
    # Publisher(StoreServer) writes into the store without a connection.
    pub = fw.Publisher(store, "m")
    sub = fw.subscribe(store.addr, "m")
    v1 = make_state()
    pub.publish(v1, version=1)
    sub.wait_for(1, timeout=WAIT)
    v2 = dict(v1)
    v2["w.f16"] = torch.zeros(32, 32, dtype=torch.float16)
    pub.publish(v2, version=2)
    got = sub._update(None, WAIT)
    assert (got["same"], got["dense"] + got["sparse"]) == (len(v2) - 1, 1), got
    assert same(sub.state_dict(), v2)
    # Named changes: the others are kept without being compared; a new name is added.
    v3 = dict(v2)
    v3["w.f32"] = torch.full((128,), 7.0)
    v3["new"] = torch.arange(5, dtype=torch.float32)
    pub.publish({"w.f32": v3["w.f32"], "new": v3["new"]}, version=3, changed=["w.f32", "new"])
    sub.wait_for(3, timeout=WAIT)
    assert same(sub.state_dict(), v3)


def test_a_tensor_changed_in_place_after_publishing_is_published_changed_never_stale(
    store: ferry.StoreServer,
) -> None:
    # The store copies what is published: the trainer's tensors stay its own, and a
    # later in-place change is a change (its digest is the new bytes', not the old one's).
    pub = fw.Publisher(store, "m")
    sub = fw.subscribe(store.addr, "m")
    sd = make_state()
    pub.publish(sd, version=1)
    sub.wait_for(1, timeout=WAIT)
    t = sd["w.f32"]
    assert isinstance(t, torch.Tensor)
    t.add_(1.0)  # in place: the same storage, new values
    pub.publish(sd, version=2)
    got = sub._update(None, WAIT)
    assert got["same"] == len(sd) - 1, got
    assert same(sub.state_dict(), sd)
    t.add_(1.0)
    pub.publish(sd, version=3, changed=["w.f32"])
    sub.wait_for(3, timeout=WAIT)
    assert same(sub.state_dict(), sd)


def test_a_reader_writing_into_its_view_of_a_version_does_not_change_the_store(
    store: ferry.StoreServer,
) -> None:
    pub = fw.Publisher(store, "m")
    v1 = make_state()
    pub.publish(v1, version=1)
    b = ferry.open_weights(store.addr, "m", as_torch=True)
    view = b["w.f32"]
    view.mul_(0.0)  # a torch view of the store's memory is copy-on-write
    assert float(view.abs().sum()) == 0.0
    sub = fw.subscribe(store.addr, "m")
    sub.wait_for(1, timeout=WAIT)
    assert same(sub.state_dict(), v1), "the store's version changed under a reader's write"
    v2 = dict(v1)
    v2["w.f16"] = torch.ones(32, 32, dtype=torch.float16)
    pub.publish(v2, version=2)
    got = sub._update(None, WAIT)
    assert got["same"] == len(v2) - 1, got  # the kept tensors' digests still hold
    assert same(sub.state_dict(), v2)
    b.close()


def test_a_subscriber_writing_into_its_state_dict_leaves_the_verified_copy_intact(
    store: ferry.StoreServer,
) -> None:
    pub = fw.Publisher(store, "m")
    sub = fw.subscribe(store.addr, "m")
    v1 = make_state()
    pub.publish(v1, version=1)
    sub.wait_for(1, timeout=WAIT)
    mine = sub.state_dict()
    for t in mine.values():
        t.reshape(-1).view(torch.uint8).fill_(0xA5)
    assert not same(mine, v1), "the writes took"
    assert same(sub.state_dict(), v1), "a write into a view reached the verified copy"
    # Version 2 changes one tensor and keeps the rest: the changed one is built on the
    # verified bytes (its digest checks), the kept ones claim version 2 with their bytes.
    v2 = step(v1, 0.05, 2)
    changed = next(n for n in v1 if not same({n: v1[n]}, {n: v2[n]}))
    pub.publish({changed: v2[changed]}, version=2, changed=[changed])
    v2 = {**v1, changed: v2[changed]}
    got = sub._update(None, WAIT)
    assert got["version"] == 2, got
    assert same(sub.state_dict(), v2)
    assert not same(mine, v1), "the reader's own pages keep its writes"


def test_a_version_being_built_cannot_be_committed_while_an_array_can_still_write_into_it(
    store: ferry.StoreServer,
) -> None:
    b = store._build("m", None, [("a", "f32", [4], False)])
    slot = b.slot(0)
    assert slot is not None
    a = np.asarray(slot)
    a[:] = 1
    with pytest.raises(RuntimeError, match="still alive"):
        b.commit("{}")
    del a, slot
    assert b.commit("{}") == 1
    with pytest.raises(RuntimeError, match="committed"):
        b.slot(0)
    sub = fw.subscribe(store.addr, "m")
    sub.wait_for(1, timeout=WAIT)
    assert bits(sub.state_dict(as_torch=False)["a"]) == b"\x01" * 16


def test_wait_for_a_version_not_published_yet_returns_when_it_is_or_times_out(
    store: ferry.StoreServer,
) -> None:
    import threading

    sub = fw.subscribe(store.addr, "m")
    with pytest.raises(TimeoutError):
        sub.wait_for(1, timeout=0.2)
    assert sub.version is None
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(sub.wait_for(2, timeout=WAIT)))
    t.start()
    pub = fw.Publisher(store, "m")
    v1 = make_state()
    pub.publish(v1, version=1)
    pub.publish(step(v1, 0.01, 9), version=2)
    t.join(WAIT)
    assert got == [2] and sub.version == 2


def test_apply_to_a_dict_of_tensors_writes_only_the_changed_elements_the_second_time(
    store: ferry.StoreServer,
) -> None:
    pub = fw.Publisher(store, "m")
    sub = fw.subscribe(store.addr, "m")
    v1 = {"x": torch.arange(1000, dtype=torch.float32)}
    pub.publish(v1, version=1)
    sub.wait_for(1, timeout=WAIT)
    model = {"x": torch.zeros(1000)}
    sub.apply_to(model)
    assert torch.equal(model["x"], v1["x"])
    # A mark in an element the next version does not change: a delta written as a delta
    # (only the changed elements) leaves it; a whole copy would not.
    model["x"][0] = -5.0
    v2 = {"x": v1["x"].clone()}
    v2["x"][500] = 0.5
    pub.publish(v2, version=2)
    sub.wait_for(2, timeout=WAIT)
    sub.apply_to(model)
    assert float(model["x"][500]) == 0.5 and float(model["x"][0]) == -5.0
    # Another dict (other tensors) is not taken for the one brought to version 2.
    other = {"x": torch.zeros(1000)}
    sub.apply_to(other)
    assert torch.equal(other["x"], v2["x"])
