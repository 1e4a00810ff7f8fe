"""bench/e2e.py's report with a multi-process devcluster (--api-workers N): the devcluster's CPU
is the sum of its store process and API workers, and each run says which process saturates."""
from __future__ import annotations

import pytest

from fixtures.benchmodules import load_bench

_e2e = load_bench("e2e", "bench_e2e")
cpu_per_apply_line, parse_api_workers, process_names = _e2e.cpu_per_apply_line, _e2e.parse_api_workers, _e2e.process_names
same_service, saturation, table_lines = _e2e.same_service, _e2e.saturation, _e2e.table_lines


def test_a_devcluster_with_api_workers_is_named_per_process_and_counted_as_one_service() -> None:
    pids = {"planner": [11, 12], "devcluster": [20, 21, 22], "nats-server": [30]}
    names = process_names(pids)
    assert names == {"planner-1": 11, "planner-2": 12, "devcluster-store": 20, "devcluster-api-1": 21,
                     "devcluster-api-2": 22, "nats-server": 30}
    members = {service: sorted(n for n in names if same_service(n, service)) for service in pids}
    assert members == {"planner": ["planner-1", "planner-2"],
                       "devcluster": ["devcluster-api-1", "devcluster-api-2", "devcluster-store"],
                       "nats-server": ["nats-server"]}
    assert process_names({"devcluster": [20]}) == {"devcluster": 20}  # one process: as before


@pytest.mark.parametrize(("percent", "verdict"), [
    ({"devcluster-store": 40, "devcluster-api-1": 93, "devcluster-api-2": 60, "planner": 50},
     "devcluster-api-1 93% (a devcluster API worker: the API server is the limit)"),
    ({"devcluster-store": 91, "devcluster-api-1": 50, "planner": 50},
     "devcluster-store 91% (the devcluster's store process: the API server is the limit)"),
    ({"devcluster": 97, "planner": 50}, "devcluster 97% (the API server, one process: it is the limit)"),
    ({"devcluster-store": 20, "devcluster-api-1": 30, "planner-2": 88}, "planner-2 88% (not the API server)"),
    ({"devcluster-store": 20, "devcluster-api-1": 30, "planner": 45}, "none (busiest planner 45%)"),
])
def test_the_saturating_process_is_named_and_whether_it_is_the_api_server(percent: dict, verdict: str) -> None:
    assert saturation(percent, cores=16) == verdict


def test_many_busy_processes_on_few_cores_make_the_cores_the_limit() -> None:
    percent = {"devcluster-store": 30, "devcluster-api-1": 60, "devcluster-api-2": 60, "planner": 40}
    assert saturation(percent, cores=2, others_pct=10) == (
        "no one process; all 200% of 200% (the cores are the limit; busiest devcluster-api-1 60%)")


def test_a_run_that_no_process_saturated_on_a_loaded_machine_says_other_work_held_the_cores() -> None:
    percent = {"devcluster-store": 1, "devcluster-api-1": 3, "nats-server": 6}
    assert saturation(percent, cores=2, load=14.5) == (
        "none (busiest nats-server 6%; load average 14.5 on 2 cores: other work held the cores)")
    assert saturation(percent, cores=16, load=14.5) == "none (busiest nats-server 6%)"


def test_a_table_row_shows_the_devcluster_summed_and_split_and_what_saturates() -> None:
    fig = {"sustained": 120.0, "raw": None, "cpu": {"planner": 4.0, "devcluster": 3.5, "nats-server": 1.0},
           "net": {"planner": 3.8}, "idle": {"planner": 5.0}, "kv": {"planner": 8.0}, "msgs": {"planner": 28.5},
           "percent": {"planner": 48.0, "devcluster-store": 12.0, "devcluster-api-1": 21.0,
                       "devcluster-api-2": 19.0, "nats-server": 12.0},
           "saturates": "none (busiest planner 48%)"}
    faster = dict(fig, sustained=240.0)
    lines = table_lines(["planner"], [(1, fig), (2, faster)])
    rows = lines[2:]
    assert rows[0].split()[:6] == ["1", "120.0", "1.00", "-", "5.0", "3.50"]
    assert rows[1].split()[:3] == ["2", "240.0", "2.00"]
    assert "none (busiest planner 48%); devcluster 52 (store 12, api-1 21, api-2 19); planner 48" in rows[0]


def test_api_workers_is_one_count_for_a_stack_and_a_list_only_for_the_raw_table() -> None:
    assert parse_api_workers("", raw_only=False) == []
    assert parse_api_workers("4", raw_only=False) == [4]
    assert parse_api_workers("1,2,4", raw_only=True) == [1, 2, 4]
    with pytest.raises(SystemExit, match=r"--api-workers: one count for the stack"):
        parse_api_workers("1,2", raw_only=False)
    with pytest.raises(SystemExit, match=r"--api-workers: every count must be 1 or more"):
        parse_api_workers("0", raw_only=False)
    with pytest.raises(SystemExit, match=r"--api-workers: expected a number, got 'two'"):
        parse_api_workers("two", raw_only=False)


def test_the_raw_phase_prints_the_devcluster_cpu_per_apply_of_each_round_and_their_median() -> None:
    rounds = [{"cpu_ms": 0.62}, {"cpu_ms": 0.48}, {"cpu_ms": 0.52}]
    assert cpu_per_apply_line(1, rounds) == \
        "devcluster CPU per JobSet apply, 1 API worker: 0.62 / 0.48 / 0.52 ms (median 0.52 ms)"
    assert cpu_per_apply_line(4, rounds[:2]) == \
        "devcluster CPU per JobSet apply, 4 API workers: 0.62 / 0.48 ms (median 0.55 ms)"


def test_the_targets_use_each_counts_median_and_name_the_machines_own_drift() -> None:
    target_lines = _e2e.target_lines

    def row(rate: float, planner: float, devcluster: float, nats: float = 20.0) -> dict:
        return {"sustained": rate, "cpu": {"planner": planner, "devcluster": devcluster},
                "net": {"planner": planner - 0.5},
                "percent": {"planner-1": 100.0, "devcluster": 30.0, "nats-server": nats, "watcher": 10.0}}

    # Interleaved 1,4,1,4,1,4: one slow 4-replica row (the machine stalled) does not decide.
    rows = [(1, row(3.0, 4.0, 5.0)), (4, row(11.0, 4.4, 5.0)), (1, row(3.2, 4.2, 5.2)), (4, row(6.0, 9.0, 8.0)),
            (1, row(2.9, 3.9, 5.1)), (4, row(11.2, 4.6, 5.3, nats=75.0))]
    lines = target_lines(["planner"], rows)
    assert lines[0] == ("target: TrainJobs/s over 1 replica (median of 3 rows each): "
                        "4 replicas 3.67x (>= 3.6x met)")
    assert lines[1] == ("target: net CPU per TrainJob at 4 replicas <= 1.1x at 1 (median of 3 rows each): "
                        "planner 1.17x NOT met; with the idle work: planner 1.15x")
    assert lines[2] == ("target: devcluster, nats-server and watcher each below 70% of a core in every row: "
                        "devcluster at most 30%, nats-server at most 75%, watcher at most 10% NOT met")
    assert lines[3] == "control: the devcluster's CPU per TrainJob (the same work in every row) at 4 over 1: 1.04x"
    two = target_lines(["planner"], [(1, row(4.0, 4.0, 5.0)), (2, row(7.8, 4.1, 5.0))])
    assert two[0] == "target: TrainJobs/s over 1 replica: 2 replicas 1.95x (>= 1.9x met)"
    assert not any("net CPU" in line for line in two)  # no 4- or 8-replica row
    eight = target_lines(["planner"], [(1, row(2.0, 4.0, 5.0)), (8, row(12.0, 4.6, 5.0))])
    assert "8 replicas 6.00x (>= 6.5x NOT met)" in eight[0]
    assert eight[1].startswith("target: net CPU per TrainJob at 8 replicas <= 1.2x at 1: planner 1.17x met")
    assert target_lines(["planner"], [(2, row(4.0, 4.0, 5.0))]) == []  # no 1-replica row to compare with
