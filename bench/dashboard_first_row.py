"""Dashboard page load on a busy machine (issue #32): the time from the start of the navigation
to the first TrainJob row, the worker row and the service row, and to the first chart drawn,
with one core kept busy by a `python3 -c 'while True: pass'` process (started here, killed by
pid at the end).

The dashboard is the one tests/integration/services/test_dashboard_page_load.py opens (real
nats-server, devcluster, watcher and dashboard: tests/fixtures/web_dashboard.py) in Debian's
Chromium through Playwright, each round in a fresh browser context (nothing cached). Two cases:
plotly.js served as usual, and its request never answered (the rows must not wait for it).
The times are taken in the page (performance.now() when each row is first rendered).

Usage: .venv/bin/python bench/dashboard_first_row.py [--rounds 3] [--no-busy] [--timeout 30]
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.web_dashboard import (  # noqa: E402
    CHROMIUM, CHROMIUM_ARGS, PLOTLY, ListedDashboard, dashboard_with_rows, time_to_rows,
)

CHART = "#chart-throughput .main-svg"  # drawn by plotly.js, on any version of the page
# Notes in the page when the first chart is drawn (seconds since the navigation started).
NOTE_CHART = f"""new MutationObserver((_, observer) => {{
  if (document.querySelector('{CHART}')) {{ window.__chartSeen = performance.now() / 1000; observer.disconnect(); }}
}}).observe(document, {{ childList: true, subtree: true }});"""


def one_round(browser, listed: ListedDashboard, hold_plotly: bool, timeout_s: float) -> dict[str, float | None]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    held: list = []
    try:
        page = context.new_page()
        page.add_init_script(NOTE_CHART)
        if hold_plotly:
            page.route(PLOTLY, lambda route: held.append(route))
        try:
            seen: dict[str, float | None] = dict(time_to_rows(page, listed, timeout_s))
        except AssertionError:  # a page that shows nothing while the chart library is missing
            return {what: None for what in (*listed.rows, "chart")}
        seen["chart"] = None
        if not hold_plotly:
            seen["chart"] = page.wait_for_function("() => window.__chartSeen", timeout=timeout_s * 1000).json_value()
        return seen
    finally:
        for route in held:  # answered at last, so that nothing is left pending in Playwright
            route.abort()
        context.close()


def figure(values: list[float | None], timeout_s: float) -> str:
    shown = [f"{v:.2f}" if v is not None else f">{timeout_s:g}" for v in values]
    known = [v for v in values if v is not None]
    median = (f"median {statistics.median(known):.2f} s" if len(known) == len(values)
              else f"not shown within {timeout_s:g} s in {len(values) - len(known)} of {len(values)} rounds")
    return f"{median} ({', '.join(shown)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-busy", action="store_true", help="no busy process (a quiet baseline)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds each page may take")
    args = parser.parse_args()
    if not Path(CHROMIUM).is_file():
        print(f"Chromium not installed at {CHROMIUM}: nothing measured")
        return 1
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="dashboard-first-row-") as workdir, \
            dashboard_with_rows(Path(workdir)) as listed, sync_playwright() as playwright:
        busy = None if args.no_busy else subprocess.Popen(["python3", "-c", "while True: pass"])
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            results = {hold: [one_round(browser, listed, hold, args.timeout) for _ in range(args.rounds)]
                       for hold in (False, True)}
        finally:
            browser.close()
            if busy is not None:
                os.kill(busy.pid, signal.SIGKILL)
                busy.wait()
    load = "one core kept busy" if not args.no_busy else "no busy process"
    print(f"dashboard page load, {os.cpu_count()} cores, {load}, {args.rounds} rounds, seconds from the "
          f"start of the navigation:")
    for hold, rounds in results.items():
        case = "plotly.js never answered" if hold else "plotly.js served"
        for what in ("trainjob", "worker", "service", "chart"):
            if hold and what == "chart":
                continue
            name = {"trainjob": "first TrainJob row", "worker": "worker row", "service": "service row",
                    "chart": "first chart drawn"}[what]
            print(f"  {case:<25} {name:<19} {figure([r[what] for r in rounds], args.timeout)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
