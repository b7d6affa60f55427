"""The 64-bit rule (PROTOCOL.md 5.5): every integer of a channel's JSON is a JSON number
in 0..=2^53 - 1; the shm and cuda-ipc readers refuse anything else with a ProtocolError."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ferry_client import ProtocolError
from ferry_client._shm import ShmPool, ShmReceiver
from ferry_client._wire import MAX_WIRE_INT, wire_int

TOO_BIG = "expected an integer in 0..=9007199254740991"


def test_wire_int_takes_numbers_up_to_2_pow_53_minus_1() -> None:
    assert MAX_WIRE_INT == 9007199254740991
    assert wire_int(0, "x") == 0
    assert wire_int(MAX_WIRE_INT, "x") == MAX_WIRE_INT
    for bad in (MAX_WIRE_INT + 1, 2**64 - 1, -1, True, "1", 1.0, None):
        with pytest.raises(ProtocolError, match=f"x: {TOO_BIG}"):
            wire_int(bad, "x")


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"release": [2**53]}, f"release: {TOO_BIG}"),
        ({"release": ["1"]}, f"release: {TOO_BIG}"),
        ({"release": [-1]}, f"release: {TOO_BIG}"),
    ],
)
def test_shm_release_bodies_break_the_rule(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        ShmPool(1 << 20).release(body)


def test_shm_forget_breaks_the_rule() -> None:
    with pytest.raises(ProtocolError, match=f"forget: {TOO_BIG}"):
        ShmReceiver(1 << 20).forget([2**53])


@pytest.mark.parametrize("field", ["segment", "offset", "len", "lease"])
def test_shm_descriptors_break_the_rule(field: str) -> None:
    desc: dict[str, Any] = {"segment": 0, "offset": 0, "len": 4, "lease": 1}
    desc[field] = 2**53
    meta = {"dtype": "u8", "shape": [4], "device": "cpu"}
    with pytest.raises(ProtocolError, match=f"{field}: {TOO_BIG}"):
        ShmReceiver(1 << 20).decode(meta, desc, np.dtype(np.uint8), [])
