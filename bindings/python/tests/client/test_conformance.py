"""The conformance scenario (`scenario.CASES`) as tests; with `$FERRY_CONFORMANCE_REPORT`
set, the run's outcomes are written there in `cargo xtask conformance`'s report format."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.client.scenario import CASES, Ctx
from tests.client.servers import Server


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_case(name: str, case: Callable[[Ctx], None], conformance: Server) -> None:
    started: list[Server] = []

    def start() -> Server:
        s = Server("conformance")
        started.append(s)
        return s

    try:
        case(Ctx(conformance.addr, start))
    finally:
        for s in started:
            s.kill()
