"""Prometheus metrics shared by the services (one process = one service = one registry).

Names reuse what dashboards already know: controller-runtime's reconcile and workqueue
metrics (a bus consumer is our work queue) and FastStream's message counters.
"""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

RECEIVED = Counter(
    "trainyard_received_messages_total", "Messages received from JetStream",
    ["service", "consumer"],
)
PUBLISHED = Counter(
    "trainyard_published_messages_total", "Messages published to JetStream",
    ["service", "stream", "result"],
)
PROCESSED_DURATION = Histogram(
    "trainyard_processed_messages_duration_seconds", "Time spent handling one message",
    ["service", "consumer"], buckets=_LATENCY_BUCKETS,
)
DEAD_LETTERS = Counter(
    "trainyard_dead_letter_messages_total", "Poison messages moved to the dead letter",
    ["service", "consumer"],
)
RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile_total", "Reconciliations per controller and result",
    ["controller", "result"],
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors_total", "Reconciliation errors per controller",
    ["controller"],
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds", "Time per reconciliation",
    ["controller"], buckets=_LATENCY_BUCKETS,
)
WORKQUEUE_DEPTH = Gauge("workqueue_depth", "Messages fetched and not yet handled", ["name"])
WORKQUEUE_ADDS = Counter("workqueue_adds_total", "Messages added to the work queue", ["name"])
WORKQUEUE_QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds",
    "Lag: time from publication to the start of handling",
    ["name"], buckets=_LATENCY_BUCKETS,
)
WATCH_EVENTS = Counter(
    "trainyard_watch_events_total", "Kubernetes watch events observed", ["kind", "type"],
)
PLANS = Counter("trainyard_plans_total", "Planning passes by result", ["result"])
APPLIES = Counter("trainyard_applies_total", "Plans handled by the applier, by outcome", ["outcome"])
APPLY_DURATION = Histogram(
    "trainyard_apply_duration_seconds", "Time to apply one plan", buckets=_LATENCY_BUCKETS,
)
STATUS_WRITES = Counter("trainyard_status_writes_total", "TrainJob status writes", ["result"])
WEBHOOK_REQUESTS = Counter(
    "trainyard_webhook_requests_total", "Admission reviews served", ["resource", "allowed"],
)
