"""The dashboard lists TrainJobs, workers and services without waiting for its chart library
(issue #32): plotly.js is 4.8 MB, and a page that loaded it before its own scripts showed no row
until it had been fetched and run (a headless Chromium dumping the page at its load event on a
busy machine saw no TrainJob and no chart).

Real processes (nats-server, a devcluster, the watcher, the dashboard: fixtures/web_dashboard.py)
and Debian's Chromium driven by Playwright; the request for /vendor/plotly.min.js is held
unanswered while the rows must appear, then answered, and the charts must be drawn.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fixtures.web_dashboard import CHROMIUM, CHROMIUM_ARGS, PLOTLY, dashboard_with_rows, time_to_rows

pytestmark = pytest.mark.timeout(240)

ROWS_WITHIN_S = 2.0


def test_rows_and_workers_appear_while_the_chart_library_never_arrives(tmp_path: Path) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium not installed at {CHROMIUM} (`make system-tools` installs Debian's package "
                    f"when run as root with apt)")
    from playwright.sync_api import expect, sync_playwright

    with dashboard_with_rows(tmp_path / "stack") as listed, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            held: list[Any] = []
            # Neither fulfilled nor aborted until the rows are checked: the library never arrives.
            page.route(PLOTLY, lambda route: held.append(route))

            # The charts ask for the library once the first data arrives (after the rows).
            with page.expect_request(lambda request: request.url.endswith("/vendor/plotly.min.js"),
                                     timeout=10_000):
                seen = time_to_rows(page, listed, timeout_s=ROWS_WITHIN_S)
            assert seen["trainjob"] <= ROWS_WITHIN_S and seen["worker"] <= ROWS_WITHIN_S, seen
            expect(page.locator(f'#trainjobs tr[data-name="{listed.trainjob}"]')).to_be_visible(timeout=1_000)
            expect(page.locator(f'#worker-table tr[data-worker="{listed.worker}"]')).to_be_visible(timeout=1_000)
            assert page.evaluate("typeof Plotly") == "undefined", "the rows were drawn after plotly.js ran"
            assert errors == [], errors  # nothing threw for the missing library

            # Held, then answered: the charts draw their latest data once the library has run.
            assert held, "the request for plotly.js was not intercepted"
            for route in held:
                route.continue_()
            page.wait_for_function("() => Charts.drawn()", timeout=60_000)
            traces = page.evaluate("() => document.getElementById('chart-throughput').data.map((t) => t.name)")
            assert traces == ["created/s", "finished/s"]
            assert page.locator("#chart-throughput .main-svg").count() > 0
            assert errors == [], errors
        finally:
            browser.close()
