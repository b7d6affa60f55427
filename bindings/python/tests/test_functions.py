"""`client.functions`: a server's functions as methods, built from `rpc.discover`, against
a `ferry.App` served by a child process and the Rust `ferry serve` demo API."""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ferry
from ferry import Functions
from tests.client.servers import Server
from tests.conftest import WAIT, Served


@pytest.fixture(scope="module")
def rust_demo() -> Iterator[Server]:
    """`ferry serve --api demo`: functions implemented in Rust."""
    s = Server("demo")
    yield s
    s.kill()


@pytest.fixture
def rust(rust_demo: Server) -> Iterator[ferry.Client]:
    with ferry.Client.connect(rust_demo.addr, timeout=WAIT) as c:
        yield c


def test_positional_and_keyword_arguments_call_the_python_function(client: ferry.Client) -> None:
    f = client.functions
    assert f.add(1, 2) == 3
    assert f.add(a=1.5, b=2) == 3.5
    assert f.add(1, b=4) == 5
    assert f.greet("ann") == "hello ann"
    assert f.greet("ann", times=2) == "hello ann hello ann"
    assert f.greet(name="bo", greeting="hi") == "hi bo"
    assert f.maybe() is None
    assert f.maybe(3) == 30


def test_positional_and_keyword_arguments_call_the_rust_function(rust: ferry.Client) -> None:
    assert rust.functions.add(1, 2) == 3
    assert rust.functions.add(b=2, a=40) == 42
    t = rust.functions.create_tensor([2, 3], "f32", fill=1.5)
    assert t.shape == (2, 3) and float(t.sum()) == 9.0
    assert rust.functions.sum(np.ones(4, np.float32)) == 4.0


def test_tensors_travel_as_with_call(client: ferry.Client) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(client.functions.scale(x, k=3.0), x * 3)
    np.testing.assert_array_equal(client.functions.echo(x), x)


def test_a_dotted_name_is_a_namespace(rust: ferry.Client) -> None:
    task = rust.functions.ferry.task.submit("add", {"a": 1, "b": 2})["task"]
    got = rust.functions.ferry.task.result(task, wait_ms=int(WAIT * 1000))
    assert got == 3
    assert rust.functions["ferry.task.status"] is rust.functions.ferry.task.status
    assert "submit" in dir(rust.functions.ferry.task)


def test_a_missing_argument_names_the_function_and_the_param(client: ferry.Client) -> None:
    with pytest.raises(ferry.ParamsError, match=r"add\(\) is missing required argument: 'b'"):
        client.functions.add(1)
    with pytest.raises(TypeError, match=r"greet\(\) is missing required argument: 'name'"):
        client.functions.greet(greeting="hi")


def test_an_unknown_argument_names_it_with_close_matches(client: ferry.Client) -> None:
    with pytest.raises(ferry.ParamsError) as e:
        client.functions.greet("ann", greting="hi")
    text = str(e.value)
    assert "greet()" in text and "'greting'" in text and "did you mean 'greeting'" in text


def test_repeated_and_too_many_arguments_are_refused(rust: ferry.Client) -> None:
    with pytest.raises(ferry.ParamsError, match=r"add\(\) got multiple values for argument 'a'"):
        rust.functions.add(1, 2, a=3)
    with pytest.raises(ferry.ParamsError, match=r"add\(\) takes 2 positional arguments \(a, b\)"):
        rust.functions.add(1, 2, 3)


def test_an_unknown_function_is_named_with_close_matches(rust: ferry.Client) -> None:
    with pytest.raises(ferry.UnknownFunctionError) as e:
        _ = rust.functions.ad
    assert "'ad'" in str(e.value) and "did you mean 'add'" in str(e.value)
    assert rust_demo_addr(rust) in str(e.value)
    assert e.value.suggestions == ["add"]
    assert isinstance(e.value, AttributeError)
    assert not hasattr(rust.functions, "no_such_function")
    with pytest.raises(ferry.UnknownFunctionError, match=r"'mtamul'.*'matmul'"):
        rust.functions["mtamul"]


def rust_demo_addr(c: ferry.Client) -> str:
    return c.address


def test_dir_lists_the_functions(client: ferry.Client, rust: ferry.Client) -> None:
    names = dir(client.functions)
    assert {"add", "greet", "scale", "echo", "ferry"} <= set(names)
    assert "rpc" not in names
    assert {"add", "create_tensor", "matmul", "whoami", "ferry"} <= set(dir(rust.functions))
    assert "add" in client.functions and "ferry.task.submit" in rust.functions
    assert "add" in list(client.functions)


def test_docstrings_and_signatures_come_from_the_document(
    client: ferry.Client, rust: ferry.Client
) -> None:
    add = client.functions.add
    assert add.__doc__ is not None and "Adds two numbers." in add.__doc__
    assert "The rest of the docstring is the description." in add.__doc__
    sig = inspect.signature(client.functions.greet)
    assert list(sig.parameters) == ["name", "greeting", "times"]
    assert sig.parameters["name"].default is inspect.Parameter.empty
    assert sig.parameters["greeting"].default == "hello"
    assert sig.parameters["times"].annotation is int
    assert sig.return_annotation is str
    rs = inspect.signature(rust.functions.add)
    assert [p.annotation for p in rs.parameters.values()] == [float, float]
    assert rust.functions.add.__doc__ is not None and "First addend." in rust.functions.add.__doc__
    assert inspect.signature(rust.functions.echo).parameters["tensor"].annotation is np.ndarray


def test_by_position_params_are_sent_as_a_list(client: ferry.Client) -> None:
    """A method whose document says `paramStructure: by-position` gets a list; a skipped
    optional param before a given one is sent as its default."""
    doc = copy.deepcopy(client.discover())
    for m in doc["methods"]:
        m["paramStructure"] = "by-position"
    f = Functions(doc, client.call, "test")
    assert f.greet.params("ann", times=2) == ["ann", "hello", 2]
    assert f.greet("ann", times=2) == "hello ann hello ann"
    assert f.add.params(b=2, a=1) == [1, 2]
    assert f.add(b=2, a=1) == 3
    assert client.functions.add.params(1, 2) == {"a": 1, "b": 2}


def test_options_set_timeout_and_as_torch(client: ferry.Client) -> None:
    torch = pytest.importorskip("torch")
    x = np.ones(3, np.float32)
    got = client.functions.echo.options(timeout=WAIT, as_torch=True)(x)
    assert isinstance(got, torch.Tensor)
    assert isinstance(client.functions.echo(x), np.ndarray)


def test_async_client_functions_return_awaitables(served: Served, rust_demo: Server) -> None:
    async def main() -> None:
        async with await ferry.AsyncClient.connect(served.addr) as c:
            fns = await c.load_functions()
            assert fns is c.functions
            assert await c.functions.add(1, 2) == 3
            assert await c.functions.async_add(a=2, b=5) == 7
            sums = await asyncio.gather(*(c.functions.add(i, i) for i in range(20)))
            assert sums == [2 * i for i in range(20)]
            with pytest.raises(ferry.ParamsError, match="add"):
                c.functions.add(1)  # raised at once, nothing to await
        async with await ferry.AsyncClient.connect(rust_demo.addr) as r:
            # first use without load_functions: one blocking fetch of the document
            assert "add" in dir(r.functions)
            assert await r.functions.add(1, 2) == 3

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_the_document_is_fetched_once_per_client(client: ferry.Client) -> None:
    first: Any = client.functions
    assert client.functions is first
    assert client.functions.add is client.functions.add
