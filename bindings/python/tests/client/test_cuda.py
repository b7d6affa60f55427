"""CUDA tensors from the client side: not yet.

The retired pure-Python client (`sdks/python`) mapped cuda-ipc tensors through CuPy, and
its tests ran that path against a fake driver (`fake_cuda.py`) and, on a GPU, against
CuPy. The native package does not map device tensors yet (a received device tensor is
refused, a CUDA torch tensor sent is copied to the host): issue 44 point 4. Until it
does, this test is skipped with that reason, so the gap shows in every run.
"""

from __future__ import annotations

import pytest


@pytest.mark.skip(
    reason="the native ferry package has no cuda-ipc path for Python yet (issue 44 point 4): "
    "device tensors are copied to the host when sent and refused when received"
)
def test_cuda_tensors_travel_over_cuda_ipc() -> None:
    raise AssertionError("unreachable: skipped until the native package maps device tensors")
