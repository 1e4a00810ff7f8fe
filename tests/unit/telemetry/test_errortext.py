"""Log lines name what failed even when the exception prints as nothing."""
import asyncio

import nats.errors
import pytest

from trainyard.errortext import describe


def raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as err:
            raise outer from err
    except BaseException as err:
        return err


def test_an_exception_with_text_reads_as_its_text() -> None:
    assert describe(ConnectionRefusedError(111, "Connection refused")) == "[Errno 111] Connection refused"
    assert describe(nats.errors.TimeoutError()) == "nats: timeout"


@pytest.mark.parametrize("err, name", [(asyncio.TimeoutError(), "TimeoutError"),
                                       (ConnectionResetError(), "ConnectionResetError"),
                                       (RuntimeError(""), "RuntimeError"),
                                       (ValueError("  \n "), "ValueError")])
def test_an_exception_without_text_reads_as_its_type(err: BaseException, name: str) -> None:
    assert describe(err) == name


def test_an_empty_exception_names_the_one_it_was_raised_from() -> None:
    assert describe(raised_from(asyncio.TimeoutError(), OSError(113, "No route to host"))) == \
        "TimeoutError from [Errno 113] No route to host"
    assert describe(raised_from(asyncio.CancelledError(), asyncio.TimeoutError())) == \
        "CancelledError from TimeoutError"


async def test_the_timeout_of_asyncio_wait_for_is_a_timeout() -> None:
    """(asyncio raises it from the CancelledError of the wait it cancelled: that adds nothing.)"""
    with pytest.raises(asyncio.TimeoutError) as timed_out:
        await asyncio.wait_for(asyncio.sleep(10), timeout=0.01)
    assert describe(timed_out.value) == "TimeoutError"


def test_a_multi_line_message_becomes_one_line() -> None:
    assert describe(RuntimeError("first\n  second")) == "first second"


def test_the_chain_is_cut_and_a_cycle_ends() -> None:
    err = RuntimeError()
    err.__cause__ = err
    assert describe(err) == "RuntimeError"
    deep: BaseException = OSError(1, "root")
    for _ in range(5):
        deep = raised_from(RuntimeError(), deep)
    assert describe(deep) == "RuntimeError from RuntimeError from RuntimeError"
