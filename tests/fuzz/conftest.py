"""Shared by the fuzzers of tests/fuzz/ (each test file is otherwise self-contained): a count of
the inputs each fuzzer tried, printed in pytest's terminal summary ("fuzz inputs tried").

``TRAINYARD_FUZZ_EXAMPLES=N`` raises every fuzzer's hypothesis ``max_examples`` to N for a
longer run (docs/security.md, "Bad input"); the defaults keep ``make test`` quick.
"""
from __future__ import annotations

from collections import Counter

import pytest

_COUNTS = pytest.StashKey[Counter]()


@pytest.fixture(scope="session")
def fuzz_count(request: pytest.FixtureRequest):
    """``fuzz_count(name)`` adds one tried input to the fuzzer ``name``."""
    counts = request.config.stash.setdefault(_COUNTS, Counter())

    def add(name: str, n: int = 1) -> None:
        counts[name] += n
    return add


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    counts = config.stash.get(_COUNTS, None)
    if not counts:
        return
    terminalreporter.section("fuzz inputs tried")
    for name in sorted(counts):
        terminalreporter.write_line(f"{name}: {counts[name]}")
    terminalreporter.write_line(f"total: {sum(counts.values())}")
