"""What a new user trips on, said in their words (issue 43): a tensor param given
something else, a param or result type ferry cannot carry, an address already in use."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable

import pytest

import ferry
from tests.conftest import ROOT, WAIT, CliServer


def test_a_tensor_param_given_a_list_says_what_to_send(client: ferry.Client) -> None:
    with pytest.raises(ferry.RpcError) as info:
        client.call("scale", {"x": [[1, 2], [3, 4]]})
    msg = info.value.message
    assert msg.startswith("Invalid params: x: expected a tensor, got a list"), msg
    assert "pass a numpy array or torch tensor from a ferry client" in msg, msg
    assert '{"$tensor": {"dtype": "f32", "shape": [2], "data": ' in msg, msg
    assert '$tensor": i' not in msg, msg
    with pytest.raises(ferry.RpcError, match="expected a tensor, got the number 3"):
        client.call("scale", {"x": 3})


def test_a_type_ferry_cannot_carry_is_named_at_registration() -> None:
    app = ferry.App("types")
    with pytest.raises(TypeError) as info:

        @app.function
        def takes_a_socket(s: socket.socket, n: int) -> int:
            return n

    msg = str(info.value)
    assert msg.startswith(
        "test_a_type_ferry_cannot_carry_is_named_at_registration.<locals>.takes_a_socket: "
        "param s is annotated socket, which ferry cannot receive or send"
    ), msg
    assert "np.ndarray" in msg, msg
    for jargon in ("core schema", "core_schema", "arbitrary_types_allowed", "errors.pydantic.dev"):
        assert jargon not in msg, msg

    with pytest.raises(TypeError, match="its result is annotated socket, which ferry cannot"):

        @app.function
        def gives_a_socket() -> socket.socket:
            return socket.socket()


def test_an_address_in_use_is_one_line_not_a_traceback(
    cli_server: Callable[..., CliServer],
) -> None:
    s = cli_server()
    second = subprocess.run(
        [sys.executable, "-m", "ferry", "serve", "tests.apps:app", s.addr],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert second.returncode == 1, second
    err = second.stderr.strip()
    assert "Traceback" not in err, err
    assert err.startswith("ferry: ") and "in use" in err, err
    assert "another server is listening there; stop it, or serve on another address" in err, err
