"""bench/waiting.py: a benchmark's wait says what it waits for and ends the run when it cannot finish."""
from __future__ import annotations

import asyncio

import pytest

from fixtures.benchmodules import load_bench

_waiting = load_bench("waiting")
GaveUp, missing, wait_until = _waiting.GaveUp, _waiting.missing, _waiting.wait_until


async def test_a_wait_that_is_met_returns(capsys: pytest.CaptureFixture[str]) -> None:
    arrived: set[str] = set()
    wake = asyncio.Event()

    async def arrive() -> None:
        for key in ("a", "b"):
            await asyncio.sleep(0.05)
            arrived.add(key)
            wake.set()

    task = asyncio.create_task(arrive())
    await wait_until("2 JobSets", lambda: arrived == {"a", "b"}, 10, wake=wake)
    await task
    assert capsys.readouterr().err == ""  # quick: nothing to say


async def test_a_wait_says_how_far_it_got_and_gives_up_past_its_budget(capsys: pytest.CaptureFixture[str]) -> None:
    keys = ["ns/a", "ns/b", "ns/c", "ns/d", "ns/e"]
    have = {"ns/a": 1.0}
    with pytest.raises(GaveUp) as gave_up:
        await wait_until("5 JobSets to be created", lambda: False, 0.5, progress=lambda: missing(keys, have),
                         poll_s=0.02, say_every_s=0.1)
    assert gave_up.value.code == ("error: gave up after 0.5s waiting for 5 JobSets to be created: "
                                  "1/5 arrived; missing e.g. ns/b, ns/c, ns/d")
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("waiting ") and line.endswith(
        "for 5 JobSets to be created: 1/5 arrived; missing e.g. ns/b, ns/c, ns/d") for line in lines)


async def test_a_stalled_wait_ends_before_its_budget() -> None:
    async def check() -> bool:
        return False

    with pytest.raises(GaveUp, match=r"no progress for 0\.2s \(3/220 placed\)"):
        await wait_until("220 TrainJobs", check, 60, progress=lambda: "3/220 placed", poll_s=0.02, stall_s=0.2)
    # (a GaveUp is a SystemExit with a message: the bench ends with status 1 and that line)
    assert issubclass(GaveUp, SystemExit)
