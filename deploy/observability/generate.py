"""Grafana dashboards as code: ``python deploy/observability/generate.py`` writes
``deploy/observability/dashboards/*.json`` with grafana-foundation-sdk.

Three dashboards over the metrics of docs/observability.md: the control plane (throughput, hop
latencies, JetStream backlog, errors, dead letters, restarts, webhooks), TrainJobs (by state,
time to start, duration) and the devcluster API server. Every panel's PromQL is evaluated
against a real Prometheus scraping a running stack in tests/e2e/test_observability.py; the
checked-in JSON must equal a fresh generation (tests/unit/telemetry/test_dashboards.py).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUT = Path(__file__).resolve().parent / "dashboards"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries, stat, table
    width: int = 12


def rate(metric: str, by: str, selector: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{selector}[$__rate_interval]))"


def quantile(q: float, metric: str, by: str, window: str = "$__rate_interval") -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{window}])))"


CONTROL_PLANE = (
    PanelSpec("Messages handled per second", "Reconciliations (handled bus messages) per consumer and result",
              (Query(rate("controller_runtime_reconcile_total", "controller, result"), "{{controller}} {{result}}"),),
              unit="ops"),
    PanelSpec("Watch events per second", "Kubernetes watch events the watcher turned into bus events",
              (Query(rate("trainyard_watch_events_total", "kind"), "{{kind}}"),), unit="ops"),
    PanelSpec("Hop latency p95 (publish to handling)",
              "workqueue_queue_duration_seconds: from publication on JetStream to the start of handling",
              (Query(quantile(0.95, "workqueue_queue_duration_seconds", "name"), "{{name}}"),), unit="s"),
    PanelSpec("Handling time p95", "workqueue_work_duration_seconds per consumer",
              (Query(quantile(0.95, "workqueue_work_duration_seconds", "name"), "{{name}}"),), unit="s"),
    PanelSpec("JetStream backlog", "Not yet delivered (pending) and delivered but unacknowledged (ack pending) "
              "messages per durable consumer, from the consumer info",
              (Query("max by (consumer) (trainyard_jetstream_consumer_pending_messages)", "{{consumer}} pending"),
               Query("max by (consumer) (trainyard_jetstream_consumer_ack_pending_messages)",
                     "{{consumer}} ack pending")), unit="short"),
    PanelSpec("Redelivered messages", "Messages delivered more than once and not yet acknowledged",
              (Query("max by (consumer) (trainyard_jetstream_consumer_redelivered_messages)", "{{consumer}}"),)),
    PanelSpec("Reconcile errors per second", "Handler errors (retried) and dead letters per consumer",
              (Query(rate("controller_runtime_reconcile_errors_total", "controller"), "{{controller}}"),),
              unit="ops"),
    PanelSpec("Dead letters", "Poison messages moved to the dead-letter stream in the time range",
              (Query("sum by (consumer) (increase(trainyard_dead_letter_messages_total[$__range]))",
                     "{{consumer}}"),), kind="stat"),
    PanelSpec("Retries per second", "Messages handed back for redelivery after an error",
              (Query(rate("workqueue_retries_total", "name"), "{{name}}"),), unit="ops"),
    PanelSpec("Process restarts", "Restarts of each process in the time range (process start time changes)",
              (Query("sum by (job) (changes(process_start_time_seconds[$__range]))", "{{job}}"),), kind="stat"),
    PanelSpec("Processes up", "Prometheus' scrape health per process",
              (Query("sum by (job) (up)", "{{job}}"),), kind="stat"),
    PanelSpec("Plans and applies per second", "Planner results and applier outcomes",
              (Query(rate("trainyard_plans_total", "result"), "plan {{result}}"),
               Query(rate("trainyard_applies_total", "outcome"), "apply {{outcome}}")), unit="ops"),
    PanelSpec("Admission requests per second", "Validating webhook requests by path and HTTP code",
              (Query(rate("controller_runtime_webhook_requests_total", "webhook, code"), "{{webhook}} {{code}}"),),
              unit="ops"),
    PanelSpec("Admission latency p95", "Time to answer one admission review",
              (Query(quantile(0.95, "controller_runtime_webhook_latency_seconds", "webhook"), "{{webhook}}"),),
              unit="s"),
    PanelSpec("Role backlog (what autoscalers read)",
              "trainyard_role_backlog_messages: pending plus ack-pending messages of each partitioned role's "
              "durables, as the watcher exports it for KEDA (docs/deploy.md)",
              (Query("max by (role, cluster) (trainyard_role_backlog_messages)", "{{role}} {{cluster}}"),),
              unit="short"),
    PanelSpec("Replicas and partitions per role",
              "Replicas serving each partitioned role, and the partitions they hold between them (docs/bus.md)",
              (Query("count by (role) (trainyard_partitions_owned)", "{{role}} replicas"),
               Query("sum by (role) (trainyard_partitions_owned)", "{{role}} partitions held")), unit="short"),
    PanelSpec("Handler slots per replica",
              "Handlers a replica runs at once: 32 per core of its CPU limit, at least 2",
              (Query("max by (role) (trainyard_replica_handler_slots)", "{{role}} most"),
               Query("min by (role) (trainyard_replica_handler_slots)", "{{role}} least")), unit="short"),
    PanelSpec("Leases lost and presences withdrawn",
              "Partitions taken from a replica while its presence was gone, and presences withdrawn because a "
              "replica's event loop stalled, in the time range",
              (Query("sum by (role) (increase(trainyard_partition_leases_lost_total[$__range]))",
                     "{{role}} leases lost"),
               Query("sum by (role) (increase(trainyard_partition_presence_withdrawn_total[$__range]))",
                     "{{role}} presences withdrawn")), kind="stat"),
)

TRAINJOBS = (
    PanelSpec("TrainJobs by state", "trainyard_trainjobs, recounted from the snapshot bucket",
              (Query("sum by (state) (max by (state, runtime) (trainyard_trainjobs))", "{{state}}"),), kind="stat",
              width=24),
    PanelSpec("TrainJobs by runtime and state", "The same figures per runtime",
              (Query("max by (runtime, state) (trainyard_trainjobs)", "{{runtime}} {{state}}"),), kind="table"),
    PanelSpec("TrainJobs over time", "By state",
              (Query("sum by (state) (max by (state, runtime) (trainyard_trainjobs))", "{{state}}"),)),
    PanelSpec("Time to start (creation to running)", "p50 and p95 of trainyard_trainjob_time_to_running_seconds",
              (Query(quantile(0.5, "trainyard_trainjob_time_to_running_seconds", "runtime", "$__range"),
                     "p50 {{runtime}}"),
               Query(quantile(0.95, "trainyard_trainjob_time_to_running_seconds", "runtime", "$__range"),
                     "p95 {{runtime}}")), unit="s"),
    PanelSpec("Duration (creation to Complete or Failed)",
              "p50 and p95 of trainyard_trainjob_time_to_complete_seconds",
              (Query(quantile(0.5, "trainyard_trainjob_time_to_complete_seconds", "runtime, result", "$__range"),
                     "p50 {{runtime}} {{result}}"),
               Query(quantile(0.95, "trainyard_trainjob_time_to_complete_seconds", "runtime, result", "$__range"),
                     "p95 {{runtime}} {{result}}")), unit="s"),
    PanelSpec("Finished in the time range", "TrainJobs that reached Complete or Failed",
              (Query("sum by (result) (increase(trainyard_trainjob_time_to_complete_seconds_count[$__range]))",
                     "{{result}}"),), kind="stat"),
    PanelSpec("Status writes per second", "TrainJob status subresource writes by result",
              (Query(rate("trainyard_status_writes_total", "result"), "{{result}}"),), unit="ops"),
)

DEVCLUSTER = (
    PanelSpec("Requests per second by verb", "apiserver_request_total",
              (Query(rate("apiserver_request_total", "verb"), "{{verb}}"),), unit="reqps"),
    PanelSpec("Requests per second by code", "apiserver_request_total",
              (Query(rate("apiserver_request_total", "code"), "{{code}}"),), unit="reqps"),
    PanelSpec("Request latency p99 by verb", "apiserver_request_duration_seconds (WATCH excluded)",
              (Query(quantile(0.99, "apiserver_request_duration_seconds", "verb"), "{{verb}}"),), unit="s"),
    PanelSpec("Requests per second by resource", "apiserver_request_total",
              (Query(rate("apiserver_request_total", "resource", '{resource!~"/.*"}'), "{{resource}}"),),
              unit="reqps"),
    PanelSpec("Stored objects", "apiserver_storage_objects per resource",
              (Query("sum by (resource) (apiserver_storage_objects)", "{{resource}}"),)),
    PanelSpec("Open watches", "apiserver_longrunning_requests{verb=\"WATCH\"}",
              (Query('sum by (resource) (apiserver_longrunning_requests{verb="WATCH"})', "{{resource}}"),)),
    PanelSpec("Watch events per second", "Events sent to watch clients",
              (Query(rate("apiserver_watch_events_total", "resource"), "{{resource}}"),), unit="ops"),
    PanelSpec("In-flight requests", "apiserver_current_inflight_requests",
              (Query("sum by (request_kind) (apiserver_current_inflight_requests)", "{{request_kind}}"),)),
)

DASHBOARDS = {
    "trainyard-control-plane": ("trainyard / control plane", CONTROL_PLANE),
    "trainyard-trainjobs": ("trainyard / TrainJobs", TRAINJOBS),
    "trainyard-devcluster-api": ("trainyard / devcluster API server", DEVCLUSTER),
}


def _panel(spec: PanelSpec):
    builder = {"timeseries": timeseries.Panel, "stat": stat.Panel, "table": table.Panel}[spec.kind]()
    panel = builder.title(spec.title).description(spec.description).datasource(DATASOURCE) \
        .unit(spec.unit).height(8).span(spec.width)
    for index, query in enumerate(spec.queries):
        target = prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id("ABCDEFGH"[index])
        if spec.kind != "timeseries":
            target = target.instant()
        panel = panel.with_target(target)
    return panel


def build(uid: str) -> dict:
    title, panels = DASHBOARDS[uid]
    board = gd.Dashboard(title).uid(uid).tags(["trainyard"]).refresh("10s").time("now-30m", "now") \
        .timezone("browser").readonly() \
        .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    for spec in panels:
        board = board.with_panel(_panel(spec))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder, sort_keys=True))


def render(uid: str) -> str:
    return json.dumps(build(uid), indent=2, sort_keys=True) + "\n"


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard.get("panels") or []
            for target in panel.get("targets") or []]


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else OUT
    out.mkdir(parents=True, exist_ok=True)
    for uid in DASHBOARDS:
        (out / f"{uid}.json").write_text(render(uid))
        print(f"wrote {out / f'{uid}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
