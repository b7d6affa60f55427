"""One class per error code, whichever client raised it.

The runtime (`ferry.rpc_errors`, generated from the Rust table) has the class of
each of ferry's codes and raises it; the generated clients re-export those classes
instead of declaring their own. So an error raised through one generated client is
caught by the runtime's class and by every other generated module's name for it, and
no generated class shadows a runtime one (or a builtin, such as `TimeoutError`).
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

import ferry
from ferry import AsyncClient, Client, RpcError, rpc_errors
from ferry._constants import ERROR_CLASSES, ERROR_CODES
from ferry.generated import conformance as conformance_api
from ferry.generated import demo as demo_api
from ferry.generated.conformance import AsyncConformanceClient, ConformanceClient
from ferry.generated.demo import AsyncDemoClient, DemoClient
from tests.client.servers import Server


def test_the_runtime_has_one_class_per_code_of_the_table() -> None:
    assert sorted(rpc_errors.ERRORS) == sorted(ERROR_CODES)
    for code, cls in rpc_errors.ERRORS.items():
        assert cls.__name__ == ERROR_CLASSES[code] and code == cls.CODE
        assert issubclass(cls, RpcError) and cls.__module__ == "ferry.rpc_errors"
        assert getattr(ferry, cls.__name__) is cls, "exported by ferry"
        assert cls.__name__ in ferry.__all__
        err = rpc_errors.error_from_code(code, "m", {"x": 1})
        assert type(err) is cls and (err.code, err.message, err.data) == (
            code,
            "m",
            {"x": 1},
        )
    assert type(rpc_errors.error_from_code(4242, "app")) is RpcError


@pytest.mark.parametrize("module", [demo_api, conformance_api])
def test_generated_modules_reexport_the_runtimes_classes(module: object) -> None:
    errors: dict[int, type[RpcError]] = module.ERRORS
    assert set(errors) == set(ERROR_CODES), "the server's table is ferry's"
    for code, cls in errors.items():
        assert cls is rpc_errors.ERRORS[code], (code, cls)
        assert getattr(module, cls.__name__) is cls
    # No class of the module's own among them, and nothing shadowing a builtin.
    own = [
        name
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == module.__name__
    ]
    assert own == [], own
    assert not hasattr(module, "TimeoutError") and not hasattr(module, "RpcTimeoutError")
    from_code = module.error_from_code
    assert type(from_code(-32003, "slow")) is ferry.ServerTimeoutError
    assert type(from_code(4242, "app")) is RpcError


def test_an_error_raised_by_one_client_is_caught_by_every_name(
    demo: Server, conformance: Server
) -> None:
    # The demo client raises INVALID_PARAMS (a string where a number goes) ...
    with DemoClient.connect(demo.addr) as d:
        with pytest.raises(conformance_api.InvalidParamsError) as caught:
            d.add("one", 2)  # type: ignore[arg-type]
        assert type(caught.value) is ferry.InvalidParamsError
        try:
            d.add("one", 2)  # type: ignore[arg-type]
        except ferry.InvalidParamsError as e:
            assert e.code == -32602
        else:
            raise AssertionError("no error")
    # ... the conformance client raises SERVER_TIMEOUT and FORBIDDEN ...
    with ConformanceClient.connect(conformance.addr) as c:
        with pytest.raises(demo_api.ServerTimeoutError) as timeout:
            c.fail(-32003, "too slow")
        assert timeout.value.message == "too slow"
        assert not isinstance(timeout.value, TimeoutError), "no builtin in its bases"
        with pytest.raises(rpc_errors.ForbiddenError):
            c.fail(-32010, "not yours")
        # ... and the API's own codes stay plain RpcErrors (no class for them).
        with pytest.raises(RpcError) as app:
            c.fail(7, "app")
        assert type(app.value) is RpcError and app.value.code == 7
    # The raw runtime client raises the same classes.
    with Client.connect(conformance.addr) as raw, pytest.raises(demo_api.ServerTimeoutError):
        raw.call("fail", {"code": -32003, "message": "raw"})


def test_the_async_clients_raise_the_same_classes(demo: Server, conformance: Server) -> None:
    async def main() -> None:
        d = await AsyncDemoClient.connect(demo.addr)
        try:
            with pytest.raises(conformance_api.InvalidParamsError):
                await d.add("one", 2)  # type: ignore[arg-type]
        finally:
            await d.close()
        c = await AsyncConformanceClient.connect(conformance.addr)
        try:
            with pytest.raises(demo_api.CancelledError):
                await c.fail(-32002, "cancelled")
        finally:
            await c.close()
        raw = await AsyncClient.connect(conformance.addr)
        try:
            with pytest.raises(ferry.TaskNotFoundError):
                await raw.call("fail", {"code": -32004, "message": "gone"})
        finally:
            await raw.close()

    asyncio.run(main())
