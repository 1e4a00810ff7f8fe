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
REDELIVERED = Counter(
    "trainyard_redelivered_messages_total",
    "Messages received again (a delivery after the first: an ack wait ran out, a nak, or a "
    "partition's messages handed over unacknowledged)",
    ["service", "consumer"],
)
PROCESSED_DURATION = Histogram(
    "trainyard_processed_messages_duration_seconds", "Time spent handling one message",
    ["service", "consumer"], buckets=_LATENCY_BUCKETS,
)
KV_OPERATIONS = Counter(
    "trainyard_kv_operations_total", "KV bucket round trips (reads, writes, listings)", ["bucket", "op"],
)
COALESCED = Counter(
    "trainyard_coalesced_messages_total",
    "Messages acknowledged unhandled because a newer one for the same object was queued behind them",
    ["service", "consumer"],
)
PARTITIONS_OWNED = Gauge(
    "trainyard_partitions_owned", "Bus partitions this replica serves (docs/bus.md)", ["role"],
)
# A replica's presence is what keeps its leases (trainyard.bus.presence): how often it was
# withdrawn because the replica's event loop stalled, and the leases taken from it meanwhile.
PRESENCE_WITHDRAWN = Counter(
    "trainyard_partition_presence_withdrawn_total",
    "Times a replica withdrew its presence because its event loop stalled (docs/bus.md)", ["role"],
)
HANDLER_SLOTS = Gauge(
    "trainyard_replica_handler_slots", "Handlers a replica runs at once, sized to its CPU limit (docs/bus.md)",
    ["role"],
)
LEASES_LOST = Counter(
    "trainyard_partition_leases_lost_total", "Partitions taken over from this replica while its presence was gone",
    ["role"],
)
SLOT_WRITE_CONFLICTS = Counter(
    "trainyard_dispatcher_slot_write_conflicts_total",
    "Writes of a worker's slot ledger that found another replica's write first (re-read and written again)",
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
WORKQUEUE_DEPTH = Gauge(
    "workqueue_depth",
    "Messages of the durable consumer not yet acknowledged: JetStream's pending (not yet "
    "delivered) plus ack-pending (delivered, being handled), from the consumer info",
    ["name"],
)
WORKQUEUE_ADDS = Counter("workqueue_adds_total", "Messages added to the work queue", ["name"])
WORKQUEUE_RETRIES = Counter(
    "workqueue_retries_total", "Messages handed back for redelivery after a handler error", ["name"],
)
WORKQUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds", "Time from the start to the end of handling one message",
    ["name"], buckets=_LATENCY_BUCKETS,
)
WORKQUEUE_UNFINISHED_WORK = Gauge(
    "workqueue_unfinished_work_seconds",
    "Seconds of work in progress: the sum of the running handlers' elapsed times", ["name"],
)
WORKQUEUE_LONGEST_RUNNING = Gauge(
    "workqueue_longest_running_processor_seconds", "Elapsed time of the longest running handler",
    ["name"],
)
# The real backlog, from JetStream's consumer info (polled while the consumer runs).
JETSTREAM_PENDING = Gauge(
    "trainyard_jetstream_consumer_pending_messages",
    "Messages in the stream matching the consumer's filter and not yet delivered to it",
    ["stream", "consumer"],
)
JETSTREAM_ACK_PENDING = Gauge(
    "trainyard_jetstream_consumer_ack_pending_messages",
    "Messages delivered to the consumer and not yet acknowledged", ["stream", "consumer"],
)
JETSTREAM_REDELIVERED = Gauge(
    "trainyard_jetstream_consumer_redelivered_messages",
    "Messages delivered more than once and not yet acknowledged", ["stream", "consumer"],
)
JETSTREAM_DELIVERED = Gauge(
    "trainyard_jetstream_consumer_delivered_sequence",
    "Last stream sequence delivered to the consumer", ["stream", "consumer"],
)
# Each partitioned role's backlog, exported by the watcher (a fixed count of replicas, running
# whatever the role's own count, zero included) for autoscalers: trainyard.bus.backlog.
ROLE_BACKLOG = Gauge(
    "trainyard_role_backlog_messages",
    "Messages a role has still to handle: pending plus ack-pending over its partitions' durable "
    "consumers (status: its events and results consumers), from one consumer listing per stream",
    ["role", "cluster"],
)
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
# The trainer status endpoint (v2.3.0 TrainJobStatus): reports answered by HTTP code, and where
# each one's time went (verify: the token against the issuer's keys; write: the status apply;
# history: the publish to the progress history), so a slow answer names its stage.
TRAINER_STATUS_REPORTS = Counter(
    "trainyard_trainer_status_reports_total", "Trainer progress reports answered, by HTTP code", ["code"],
)
TRAINER_STATUS_STAGE = Histogram(
    "trainyard_trainer_status_stage_seconds", "Time of one stage of answering a trainer progress report",
    ["stage"], buckets=_LATENCY_BUCKETS,
)
WEBHOOK_REQUESTS = Counter(
    "trainyard_webhook_requests_total", "Admission reviews served", ["resource", "allowed"],
)
# controller-runtime's webhook metrics: requests by HTTP code, latency, in flight.
WEBHOOK_REQUESTS_BY_CODE = Counter(
    "controller_runtime_webhook_requests_total", "Admission requests by webhook path and HTTP code",
    ["webhook", "code"],
)
WEBHOOK_LATENCY = Histogram(
    "controller_runtime_webhook_latency_seconds", "Time to answer one admission request",
    ["webhook"], buckets=_LATENCY_BUCKETS,
)
WEBHOOK_IN_FLIGHT = Gauge(
    "controller_runtime_webhook_requests_in_flight", "Admission requests being answered", ["webhook"],
)

# TrainJob lifecycle (status service): how many in each state, and how long they take.
TRAINJOB_STATES = ("Pending", "Running", "Suspended", "Complete", "Failed")
TRAINJOBS = Gauge(
    "trainyard_trainjobs", "TrainJobs by state and runtime (from the snapshot bucket)",
    ["state", "runtime"],
)
_LIFECYCLE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
TRAINJOB_TIME_TO_RUNNING = Histogram(
    "trainyard_trainjob_time_to_running_seconds",
    "From the TrainJob's creation to the first time its JobSet had active pods", ["runtime"],
    buckets=_LIFECYCLE_BUCKETS,
)
TRAINJOB_TIME_TO_COMPLETE = Histogram(
    "trainyard_trainjob_time_to_complete_seconds",
    "From the TrainJob's creation to its Complete or Failed condition", ["runtime", "result"],
    buckets=_LIFECYCLE_BUCKETS,
)


RECONCILE_RESULTS = ("success", "error", "dead_letter")


def init_consumer_metrics(service: str, consumer: str) -> None:
    """Creates every labelled series of a consumer at zero, as controller-runtime does, so
    error and dead-letter panels have series in a healthy run."""
    for result in RECONCILE_RESULTS:
        RECONCILE_TOTAL.labels(consumer, result)
    RECONCILE_ERRORS.labels(consumer)
    RECONCILE_TIME.labels(consumer)
    DEAD_LETTERS.labels(service, consumer)
    RECEIVED.labels(service, consumer)
    REDELIVERED.labels(service, consumer)
    PROCESSED_DURATION.labels(service, consumer)
    for metric in (WORKQUEUE_ADDS, WORKQUEUE_RETRIES, WORKQUEUE_QUEUE_DURATION, WORKQUEUE_WORK_DURATION):
        metric.labels(consumer)
    for gauge in (WORKQUEUE_DEPTH, WORKQUEUE_UNFINISHED_WORK, WORKQUEUE_LONGEST_RUNNING):
        gauge.labels(consumer).set(0)


def init_runtime_series(runtime: str) -> None:
    """Every state of a runtime at zero (the gauge is then set from the counts)."""
    for state in TRAINJOB_STATES:
        TRAINJOBS.labels(state, runtime)
    TRAINJOB_TIME_TO_RUNNING.labels(runtime)
    for result in ("Complete", "Failed"):
        TRAINJOB_TIME_TO_COMPLETE.labels(runtime, result)


# The label values each service's own counters take, created at zero when the service starts.
_SERVICE_SERIES: dict[str, list[tuple[Counter, tuple[str, ...]]]] = {
    "planner": [(PLANS, (r,)) for r in ("published", "unchanged", "failed", "child_unchanged",
                                         "nothing_to_do", "being_deleted", "managed_by_another_controller")],
    "applier": [(APPLIES, (o,)) for o in ("applied", "failed", "skipped-stale", "skipped-unchanged")],
    "status": [(STATUS_WRITES, (r,)) for r in ("written", "unchanged", "conflict", "error")],
    "watcher": [(WATCH_EVENTS, (k, t)) for k in ("TrainJob", "JobSet", "TrainingRuntime", "ClusterTrainingRuntime")
                for t in ("ADDED", "MODIFIED", "DELETED")],
}


def init_service_metrics(service: str) -> None:
    for counter, labels in _SERVICE_SERIES.get(service, []):
        counter.labels(*labels)
    for stream in ("events", "desired", "results", "dead"):
        for result in ("stored", "duplicate"):
            PUBLISHED.labels(service, stream, result)
