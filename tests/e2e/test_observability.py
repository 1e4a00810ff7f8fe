"""Observability of a running `trainyard up` (issue #14): every process serves the documented
metric names, every TrainJob change is one connected OTLP trace (received here by an OTLP/HTTP
receiver decoding with opentelemetry-proto), and every Grafana panel's PromQL returns series in
a real Prometheus (Debian's package) scraping the stack during a burst of TrainJobs.

One stack for the module: starting one costs seconds on a small machine.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from fixtures.pipeline_builders import torch_cluster_runtime
from fixtures.prometheus import PROMETHEUS, Prometheus, scrape_config as prometheus_scrape_config
from fixtures.stack import REPO, RunningStack, skip_unless_stack_available, start_stack
from fixtures.trainers import chart_points, reporting_command, wait_for_charts
from trainyard.roles import CLUSTER_ROLES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SERVICES = CLUSTER_ROLES
RUNTIME = "obs-quick"
BURST = 4
# Grafana's variables as the test substitutes them (scrape interval 1 s, burst within minutes).
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "15m", "$__interval": "15s"}


# ---------------------------------------------------------------------------------------- OTLP


class OtlpReceiver:
    """OTLP/HTTP (protobuf) trace receiver: POST /v1/traces, decoded with opentelemetry-proto."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, request: Any) -> None:
        decoded = []
        for resource_spans in request.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    decoded.append({
                        "service": service, "name": span.name,
                        "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                        "parent": span.parent_span_id.hex(),
                        "attributes": {a.key: a.value.string_value or a.value.int_value for a in span.attributes},
                        "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    })
        with self.lock:
            self.spans.extend(decoded)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.spans)


# ---------------------------------------------------------------------------------- Prometheus


def scrape_config(stack: RunningStack, token_file: Path) -> dict[str, Any]:
    """One job per process: the four services' and the dashboard's /metrics, and devcluster's
    (HTTPS, bearer token)."""
    return prometheus_scrape_config(stack, (*SERVICES, "dashboard"), token_file)


# ------------------------------------------------------------------------------------ the stack


def quick_runtime() -> dict[str, Any]:
    """A torch-shaped ClusterTrainingRuntime whose pod runs a few seconds and logs a loss."""
    return torch_cluster_runtime(RUNTIME, ["/bin/sh", "-c", "echo 'step 1 loss 0.91'; sleep 3; echo 'step 2 loss 0.42'"])


def trainjob(name: str) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"runtimeRef": {"name": RUNTIME}}}


def apply(stack: RunningStack, *objects: dict[str, Any]) -> None:
    stack.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(list(objects)))


def wait_complete(stack: RunningStack, names: list[str], timeout: float = 240) -> dict[str, str]:
    """uid of each TrainJob once all are Complete."""
    deadline = time.monotonic() + timeout
    while True:
        items = json.loads(stack.kubectl("get", "trainjobs", "-n", "default", "-o", "json").stdout)["items"]
        done = {item["metadata"]["name"]: item["metadata"]["uid"] for item in items
                if item["metadata"]["name"] in names and any(
                    c["type"] == "Complete" and c["status"] == "True"
                    for c in (item.get("status") or {}).get("conditions") or [])}
        if len(done) == len(names):
            return done
        if time.monotonic() > deadline:
            raise AssertionError(f"TrainJobs not Complete after {timeout}s: "
                                 f"{sorted(set(names) - set(done))}\n{stack.output()[-2000:]}")
        time.sleep(1)


def devcluster_token(stack: RunningStack) -> str:
    config = yaml.safe_load(stack.kubeconfig.read_text())
    return config["users"][0]["user"]["token"]


def wait_for_runtime_series(stack: RunningStack, prometheus: Prometheus | None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    status_port = stack.state["ports"]["status"]
    while True:
        if prometheus is not None:
            up = prometheus.query("up")["data"]["result"]
            series = prometheus.query(f'trainyard_trainjobs{{runtime="{RUNTIME}"}}')["data"]["result"]
            ready = len(up) == 2 + len(SERVICES) and all(r["value"][1] == "1" for r in up) and series
        else:
            text = httpx.get(f"http://127.0.0.1:{status_port}/metrics", timeout=5).text
            ready = f'trainyard_trainjobs{{runtime="{RUNTIME}"' in text
        if ready:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no {RUNTIME} series before the burst (targets: "
                                 f"{prometheus.query('up') if prometheus else 'no prometheus'})")
        time.sleep(0.5)


class Observed:
    def __init__(self, stack: RunningStack, receiver: OtlpReceiver, prometheus: Prometheus | None,
                 uids: dict[str, str]) -> None:
        self.stack, self.receiver, self.prometheus, self.uids = stack, receiver, prometheus, uids


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    skip_unless_stack_available()
    receiver = OtlpReceiver()
    receiver.start()
    workdir = tmp_path_factory.mktemp("observability")
    saved = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # export within a fraction of a second
    stack = prometheus = None
    try:
        stack = start_stack(workdir / "data", "--otlp-endpoint", receiver.url)
        if Path(PROMETHEUS).is_file():
            token_file = workdir / "token"
            token_file.write_text(devcluster_token(stack))
            prometheus = Prometheus(workdir / "prometheus", scrape_config(stack, token_file))
            prometheus.start()
        apply(stack, quick_runtime())
        # Before the burst: the runtime's TrainJob series exist (at zero) and, with Prometheus,
        # every target has been scraped with them, so rates and increases count the burst.
        wait_for_runtime_series(stack, prometheus)
        names = [f"obs-{i}" for i in range(BURST)]
        apply(stack, *(trainjob(name) for name in names))
        uids = wait_complete(stack, names)
        time.sleep(7)  # the TrainJob gauge is recounted every 5 s; a few scrapes after the burst
        yield Observed(stack, receiver, prometheus, uids)
    finally:
        if saved is None:
            os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = saved
        if prometheus is not None:
            prometheus.stop()
        if stack is not None:
            stack.stop()
            stack.kill()
        receiver.stop()


# ---------------------------------------------------------------------------------- metrics

CONSUMER_METRICS = (
    "controller_runtime_reconcile_total", "controller_runtime_reconcile_errors_total",
    "controller_runtime_reconcile_time_seconds_bucket", "workqueue_depth", "workqueue_adds_total",
    "workqueue_retries_total", "workqueue_queue_duration_seconds_bucket", "workqueue_work_duration_seconds_bucket",
    "workqueue_unfinished_work_seconds", "workqueue_longest_running_processor_seconds",
    "trainyard_jetstream_consumer_pending_messages", "trainyard_jetstream_consumer_ack_pending_messages",
    "trainyard_jetstream_consumer_redelivered_messages", "trainyard_dead_letter_messages_total",
    "trainyard_received_messages_total", "trainyard_redelivered_messages_total", "trainyard_published_messages_total",
    "trainyard_replica_handler_slots", "process_start_time_seconds",
)
EXPECTED = {
    "watcher": ("trainyard_watch_events_total", "trainyard_published_messages_total", "process_start_time_seconds",
                "trainyard_role_backlog_messages"),
    "planner": CONSUMER_METRICS + ("trainyard_plans_total", "controller_runtime_webhook_requests_total",
                                   "controller_runtime_webhook_latency_seconds_bucket",
                                   "trainyard_webhook_requests_total"),
    "applier": CONSUMER_METRICS + ("trainyard_applies_total", "trainyard_apply_duration_seconds_bucket"),
    "status": CONSUMER_METRICS + ("trainyard_status_writes_total", "trainyard_trainjobs",
                                  "trainyard_trainjob_time_to_running_seconds_bucket",
                                  "trainyard_trainjob_time_to_complete_seconds_bucket"),
    "dashboard": ("process_start_time_seconds",),
    "devcluster": ("apiserver_request_total", "apiserver_request_duration_seconds_bucket",
                   "apiserver_current_inflight_requests", "apiserver_longrunning_requests",
                   "apiserver_storage_objects", "apiserver_watch_events_total", "process_start_time_seconds"),
}


def sample_names(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def scrape_all(observed: Observed) -> dict[str, str]:
    ports = observed.stack.state["ports"]
    texts = {name: httpx.get(f"http://127.0.0.1:{ports[name]}/metrics", timeout=10).text
             for name in (*SERVICES, "dashboard")}
    texts["devcluster"] = httpx.get(f"{observed.stack.state['api_url']}/metrics", verify=False, timeout=10,
                                    headers={"Authorization": f"Bearer {devcluster_token(observed.stack)}"}).text
    return texts


def test_every_process_serves_the_documented_metrics(observed: Observed) -> None:
    texts = scrape_all(observed)
    for process, names in EXPECTED.items():
        missing = sorted(set(names) - sample_names(texts[process]))
        assert not missing, f"{process} /metrics lacks {missing}"
    documented = (REPO / "docs" / "observability.md").read_text()
    for names in EXPECTED.values():
        for name in names:
            base = name.removesuffix("_bucket")
            assert base in documented, f"{base} is not documented in docs/observability.md"
    # Series at zero in a healthy run, and the real figures after the burst.
    assert 'controller_runtime_reconcile_total{controller="applier_default",result="dead_letter"} 0.0' \
        in texts["applier"]
    assert 'trainyard_trainjobs{runtime="obs-quick",state="Complete"}' in texts["status"]
    complete = [line for line in texts["status"].splitlines()
                if line.startswith('trainyard_trainjobs{runtime="obs-quick",state="Complete"}')]
    assert complete and float(complete[0].split()[-1]) >= BURST or _eventually_counted(observed)
    assert 'apiserver_request_total{code="201",group="trainer.kubeflow.org",resource="trainjobs",' \
           'subresource="",verb="POST"}' in texts["devcluster"]
    count_line = next(line for line in texts["status"].splitlines()
                      if line.startswith('trainyard_trainjob_time_to_complete_seconds_count{result="Complete",'
                                         'runtime="obs-quick"}'))
    assert float(count_line.split()[-1]) >= 1


def _eventually_counted(observed: Observed) -> bool:
    """The state gauge is recounted every few seconds."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        text = scrape_all(observed)["status"]
        for line in text.splitlines():
            if line.startswith('trainyard_trainjobs{runtime="obs-quick",state="Complete"}') \
                    and float(line.split()[-1]) >= BURST:
                return True
        time.sleep(1)
    return False


# ----------------------------------------------------------------------------------- traces


def traces_by_uid(spans: list[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """trainjob.uid -> trace id -> spans."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for span in spans:
        uid = span["attributes"].get("trainjob.uid")
        if uid:
            grouped.setdefault(uid, {}).setdefault(span["trace_id"], []).append(span)
    return grouped


def connected(spans: list[dict[str, Any]]) -> bool:
    """One root, and every other span's parent is in the trace."""
    ids = {span["span_id"] for span in spans}
    roots = [span for span in spans if not span["parent"]]
    return len(roots) == 1 and all(span["parent"] in ids for span in spans if span["parent"])


def test_one_connected_trace_per_trainjob_change_and_linked_status_traces(observed: Observed) -> None:
    creation_traces: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + 60  # generous: a loaded machine exports late
    while True:
        grouped = traces_by_uid(observed.receiver.snapshot())
        problems = []
        for name, uid in observed.uids.items():
            traces = grouped.get(uid, {})
            # The creation: watcher observation -> planner (phases) -> applier (SSA) -> status.
            found = None
            for spans in traces.values():
                names = {s["name"] for s in spans}
                if {"observe TrainJob", "SSA JobSet", "phase build", "Torch enforce_ml_policy"} <= names:
                    found = spans
            if found is None:
                problems.append(f"{name}: no trace from observation to SSA among {len(traces)} traces: "
                                + "; ".join(",".join(sorted({f"{s['service']}:{s['name']}" for s in spans}))
                                            for spans in traces.values()))
                continue
            creation_traces[uid] = found
            # Links point at a span of a TrainJob-change trace of the same TrainJob.
            targets = {(s["trace_id"], s["span_id"]) for spans in traces.values()
                       if any(x["name"] == "observe TrainJob" for x in spans) for s in spans}
            linked = [spans for spans in traces.values()
                      if any(s["name"] == "fold JobSet status" and any(link in targets for link in s["links"])
                             for s in spans)]
            if not any(any(s["name"] == "status write TrainJob" for s in spans) for spans in linked):
                problems.append(f"{name}: no status write in a JobSet-driven trace linked to the TrainJob")
        if not problems:
            break
        if time.monotonic() > deadline:
            raise AssertionError("\n".join(problems))
        time.sleep(1)
    for uid, spans in creation_traces.items():
        assert connected(spans), f"trace of {uid} is not connected: {[(s['name'], s['parent']) for s in spans]}"
        services = {s["service"] for s in spans}
        assert {"trainyard-watcher", "trainyard-planner", "trainyard-applier"} <= services, services
        assert all(s["attributes"].get("trainjob.uid") == uid for s in spans)
        root = next(s for s in spans if not s["parent"])
        assert root["name"] == "observe TrainJob" and root["service"] == "trainyard-watcher"
        names = [s["name"] for s in spans]
        assert "process planner_default" in names and "process applier_default" in names, names
        assert "process status_default" in names, names  # status sees the same change in the same trace
        for phase in ("enforce_ml_policy", "enforce_pod_group_policy", "identify_pod_network", "build"):
            assert f"phase {phase}" in names, names


# ------------------------------------------------------------------------------- dashboards


def substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def test_every_dashboard_panel_returns_series_in_prometheus(observed: Observed) -> None:
    if observed.prometheus is None:
        pytest.skip(f"Prometheus not installed at {PROMETHEUS} (`make system-tools` installs Debian's "
                    f"package when run as root with apt)")
    sys.path.insert(0, str(REPO / "deploy" / "observability"))
    try:
        import generate
    finally:
        sys.path.pop(0)
    prometheus = observed.prometheus
    report, failures = [], []
    for path in sorted((REPO / "deploy" / "observability" / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for title, expr in generate.panel_queries(board):
            answer = prometheus.query(substitute(expr))
            if answer.get("status") != "success":
                failures.append(f"{board['title']} / {title}: {expr}: {answer.get('error')}")
                continue
            result = answer["data"]["result"]
            values = [float(r["value"][1]) for r in result]
            with_data = [v for v in values if v == v and v != 0]
            report.append(f"{board['title']} | {title} | {len(result)} series | "
                          f"{'non-zero data' if with_data else 'zero/NaN only'} | {expr}")
            if not result:
                failures.append(f"{board['title']} / {title}: no series for {expr}")
    out = Path(os.environ.get("TRAINYARD_OBSERVABILITY_REPORT", observed.stack.data_dir.parent / "panels.txt"))
    out.write_text("\n".join(report) + "\n")
    print("\n".join(report))
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------ web dashboard

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_the_web_dashboard_shows_a_new_trainjob_turn_complete_without_reload(observed: Observed) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium not installed at {CHROMIUM} (`make system-tools` installs Debian's package "
                    f"when run as root with apt)")
    from playwright.sync_api import expect, sync_playwright

    stack = observed.stack
    url = stack.state.get("dashboard_url")
    assert url, f"stack.json has no dashboard_url: {stack.state}"
    assert f"Dashboard: {url}" in stack.output()
    shots = stack.data_dir.parent / "screenshots"
    shots.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            expect(page.locator("#connection")).to_have_text("live", timeout=20_000)
            page.evaluate("window.__loadedOnce = true")
            # The burst is listed, Complete.
            for name in observed.uids:
                expect(page.locator(f'#trainjobs tr[data-name="{name}"] td.state')).to_have_text("Complete",
                                                                                               timeout=20_000)
            # The services and the backlog of every consumer.
            for service in SERVICES:
                expect(page.locator("#services tbody")).to_contain_text(service)
            expect(page.locator("#services tbody")).to_contain_text("ready")
            expect(page.locator("#consumers tbody")).to_contain_text("applier_default")

            apply(stack, trainjob("obs-live"))
            row = page.locator('#trainjobs tr[data-name="obs-live"]')
            expect(row).to_be_visible(timeout=30_000)
            row.click()
            expect(row.locator("td.state")).to_have_text("Complete", timeout=120_000)
            assert page.evaluate("window.__loadedOnce === true"), "the page was reloaded"
            # Its timeline with the measured hops, its pod and the pod's last log lines.
            timeline = page.locator("#timeline")
            for stage in ("created", "observed", "planned", "applied", "running", "finished"):
                expect(timeline.locator(f'li[data-stage="{stage}"]')).to_be_visible(timeout=20_000)
            expect(page.locator("#pods")).to_contain_text("loss 0.42", timeout=20_000)
            expect(page.locator("#detail-state")).to_have_text("Complete")
            wait_for_charts(page)  # the screenshot shows them
            page.screenshot(path=str(shots / "dashboard.png"), full_page=True)
            if os.environ.get("TRAINYARD_UPDATE_SCREENSHOT") == "1":
                (REPO / "docs" / "images").mkdir(exist_ok=True)
                shutil.copyfile(shots / "dashboard.png", REPO / "docs" / "images" / "dashboard.png")
        finally:
            browser.close()
    assert (shots / "dashboard.png").stat().st_size > 10_000


# ------------------------------------------------------------------------- dashboard charts

REPORTING_RUNTIME = "obs-reporting"
REPORTS = 5


def reporting_runtime() -> dict[str, Any]:
    runtime = quick_runtime()
    runtime["metadata"]["name"] = REPORTING_RUNTIME
    container = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]
    container["command"] = reporting_command(REPORTS)
    return runtime


def restart_dashboard(stack: RunningStack, timeout: float = 60) -> None:
    state = json.loads((stack.data_dir / "stack.json").read_text())
    pid = state["children"]["dashboard"]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while True:
        state = json.loads((stack.data_dir / "stack.json").read_text())
        if state["children"]["dashboard"]["pid"] != pid:
            try:
                if httpx.get(f"{state['dashboard_url']}readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the dashboard was not restarted within {timeout}s: {state.get('children')}")
        time.sleep(0.3)


def test_the_dashboard_charts_every_progress_report_and_keeps_the_curve_across_a_reload(observed: Observed) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium not installed at {CHROMIUM} (`make system-tools` installs Debian's package "
                    f"when run as root with apt)")
    from playwright.sync_api import expect, sync_playwright

    stack = observed.stack
    url = stack.state["dashboard_url"]
    apply(stack, reporting_runtime())
    apply(stack, {**trainjob("obs-curve"), "spec": {"runtimeRef": {"name": REPORTING_RUNTIME}}})
    wait_complete(stack, ["obs-curve"])
    status = json.loads(stack.kubectl("get", "trainjob", "obs-curve", "-o", "json").stdout)["status"]
    assert status["trainerStatus"]["progressPercentage"] == 100, status
    shots = stack.data_dir.parent / "screenshots"
    shots.mkdir(exist_ok=True)
    want = {"data": REPORTS, "drawn": REPORTS}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1300})
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto(url)
            expect(page.locator("#connection")).to_have_text("live", timeout=20_000)
            page.locator('#trainjobs tr[data-name="obs-curve"]').click()
            expect(page.locator("#progress-count")).to_have_text(f"{REPORTS} reports", timeout=20_000)
            assert chart_points(page, "chart-trainjob", "loss") == want
            assert chart_points(page, "chart-trainjob", "progress %") == want
            losses = page.evaluate("document.getElementById('chart-trainjob').data[0].y")
            assert losses == [round(1.0 / step, 4) for step in range(1, REPORTS + 1)]
            # The stack's charts: the burst and this TrainJob were created and finished in the window.
            created = page.evaluate("document.getElementById('chart-throughput').data[0].y")
            finished = page.evaluate("document.getElementById('chart-throughput').data[1].y")
            assert sum(created) > 0 and sum(finished) > 0, (created, finished)
            assert chart_points(page, "chart-latency", "create → running")["data"] >= 1
            page.screenshot(path=str(shots / "dashboard-charts.png"), full_page=True)

            # A reload: the page asks the server, which reads the history back from the bus.
            page.reload()
            expect(page.locator("#connection")).to_have_text("live", timeout=20_000)
            expect(page.locator("#detail-name")).to_have_text("default/obs-curve", timeout=20_000)
            expect(page.locator("#progress-count")).to_have_text(f"{REPORTS} reports", timeout=20_000)
            assert chart_points(page, "chart-trainjob", "loss") == want

            # A dashboard restart (killed; the supervisor starts it again on its port): the
            # history is the bus's, not the process's.
            restart_dashboard(stack)
            page.reload()
            expect(page.locator("#connection")).to_have_text("live", timeout=30_000)
            expect(page.locator("#progress-count")).to_have_text(f"{REPORTS} reports", timeout=20_000)
            assert chart_points(page, "chart-trainjob", "loss") == want
            assert errors == []  # no script error in the page
            if os.environ.get("TRAINYARD_UPDATE_SCREENSHOT") == "1":
                (REPO / "docs" / "images").mkdir(exist_ok=True)
                shutil.copyfile(shots / "dashboard-charts.png", REPO / "docs" / "images" / "dashboard-charts.png")
        finally:
            browser.close()
