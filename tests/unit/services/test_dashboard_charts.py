"""What the dashboard's charts plot (trainyard_services.dashboard.charts): report points, the stack's
throughput and latency series, and a worker's capacity."""
from __future__ import annotations

from fractions import Fraction

from trainyard.bus.envelopes import ProgressReport
from trainyard_services.dashboard.charts import Lifetime, metric_number, progress_point, stack_series, worker_row


def test_a_report_becomes_one_point_with_numeric_metrics() -> None:
    report = ProgressReport(cluster="c", namespace="ns", name="job", uid="u", resourceVersion="42", at=1700000000.25,
                            progressPercentage=40, estimatedRemainingSeconds=30,
                            metrics=[{"name": "loss", "value": "0.25"}, {"name": "lr", "value": "1e-3"},
                                     {"name": "phase", "value": "warmup"}, {"name": "bad", "value": "nan"}])
    assert progress_point(report) == {"rv": "42", "at": 1700000000.25, "progress": 40, "eta": 30,
                                      "metrics": {"loss": 0.25, "lr": 0.001, "phase": None, "bad": None}}
    assert metric_number("inf") is None and metric_number("-3") == -3.0


def test_stack_series_counts_per_bucket_and_places_latency_at_running_time() -> None:
    now = 1000.0
    lifetimes = [Lifetime(created=995.0, running=997.5, finished=999.0),  # the bucket [990, 1000)
                 Lifetime(created=981.0, running=None, finished=None),  # [980, 990)
                 Lifetime(created=982.0, running=985.0, finished=None),
                 Lifetime(created=100.0, running=150.0, finished=200.0),  # before the window
                 Lifetime(created=None)]
    series = stack_series(lifetimes, now, window_s=60, bucket_s=10)
    assert series["t"] == [960, 970, 980, 990, 1000, 1010]
    assert series["created_per_s"] == [0, 0, 0, 0.2, 0.1, 0]
    assert series["finished_per_s"] == [0, 0, 0, 0, 0.1, 0]
    assert series["latency"] == {"at": [985.0, 997.5], "seconds": [3.0, 2.5]}


def test_a_worker_shows_used_and_free_capacity_and_its_trainjobs() -> None:
    active = {"type": "Active", "status": "True", "reason": "Active", "message": "Connected"}
    row = worker_row("worker-1", active, {"cpu": Fraction(8), "memory": Fraction(16 * 2**30), "pods": Fraction(110)},
                     {"cpu": Fraction(5, 2), "memory": Fraction(2**30), "pods": Fraction(3)},
                     {"Running": 2, "Complete": 1})
    assert row == {"name": "worker-1", "active": True, "reason": "Active", "message": "Connected",
                   "capacity": {"cpu": {"used": 2.5, "free": 5.5, "total": 8.0},
                                "memory": {"used": 1.0, "free": 15.0, "total": 16.0},
                                "pods": {"used": 3.0, "free": 107.0, "total": 110.0}},
                   "trainjobs": {"Complete": 1, "Running": 2}, "total_trainjobs": 3}
    lost = worker_row("worker-2", {"status": "False", "reason": "ClientConnectionFailed", "message": "refused"},
                      None, None, {})
    assert (lost["active"], lost["reason"], lost["capacity"]) == (False, "ClientConnectionFailed", None)
    # More requested than allocatable (overcommitted pods): shown full, never negative.
    full = worker_row("w", None, {"cpu": Fraction(1)}, {"cpu": Fraction(3)}, {})
    assert full["capacity"] == {"cpu": {"used": 1.0, "free": 0.0, "total": 1.0}} and full["active"] is False
