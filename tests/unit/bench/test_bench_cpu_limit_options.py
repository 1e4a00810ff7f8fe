"""--cpu-limit and --limit-roles on bench/multicluster.py and bench/takeover.py (issue #33): the
options, shared with bench/e2e.py through bench/cpu_quota.py, the replicas' cgroups lifted while
they start and limited once ready, and the dispatcher table with its 3.4x target."""
from __future__ import annotations

import sys

import pytest

from fixtures.benchmodules import BENCH, load_bench

_quota = load_bench("cpu_quota")
_multicluster = load_bench("multicluster", "bench_multicluster")
_takeover = load_bench("takeover", "bench_takeover")


def test_loading_the_benches_leaves_the_e2e_test_package_and_sys_path_alone() -> None:
    assert str(BENCH) not in sys.path
    e2e = sys.modules.get("e2e")
    assert e2e is None or getattr(e2e, "__file__", "") != str(BENCH / "e2e.py")


def test_multicluster_takes_a_cpu_limit_for_the_dispatchers_and_a_table_of_dispatcher_counts() -> None:
    args = _multicluster.parse_args(["--cpu-limit", "0.1", "--dispatchers", "1,2,4"])
    assert (args.cpu_limit, args.limit_roles, args.dispatchers) == (0.1, ("dispatcher",), [1, 2, 4])
    args = _multicluster.parse_args(["--cpu-limit", "0.5", "--limit-roles", "dispatcher,planner",
                                     "--replicas", "1,4"])  # the older name of --dispatchers
    assert (args.limit_roles, args.dispatchers) == (("dispatcher", "planner"), [1, 4])
    args = _multicluster.parse_args([])
    assert (args.cpu_limit, args.dispatchers) == (0.0, [])


@pytest.mark.parametrize(("argv", "message"), [
    (["--cpu-limit", "0.1", "--limit-roles", "dispatcher,scheduler"], r"--limit-roles: unknown services \['scheduler'\]"),
    (["--cpu-limit", "-1"], r"--cpu-limit: cores, above 0, got -1"),
    (["--cpu-limit", "0.1", "--limit-roles", ""], r"--limit-roles: --cpu-limit needs at least one service"),
    (["--dispatchers", "1,two"], r"--dispatchers: expected counts such as 1,2,4, got '1,two'"),
    (["--dispatchers", "0,1"], r"--dispatchers: every count must be at least 1"),
])
def test_multicluster_says_what_is_wrong_with_its_limit_options(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        _multicluster.parse_args(argv)


def test_takeover_takes_a_cpu_limit_for_the_partitioned_roles() -> None:
    args = _takeover.parse_args(["--cpu-limit", "0.1"])
    assert (args.cpu_limit, args.limit_roles) == (0.1, ("planner", "applier", "status"))
    assert _takeover.parse_args(["--cpu-limit", "0.1", "--limit-roles", "applier"]).limit_roles == ("applier",)
    with pytest.raises(SystemExit, match=r"--limit-roles: unknown services \['dispatcher'\]"):
        _takeover.parse_args(["--cpu-limit", "0.1", "--limit-roles", "dispatcher"])


@pytest.mark.parametrize(("child", "role"), [
    ("dispatcher", "dispatcher"), ("planner", "planner"), ("planner-2", "planner"), ("worker-1-applier", "applier"),
    ("worker-2-planner-3", "planner"), ("worker-1-devcluster", "devcluster"), ("nats", "nats"),
])
def test_a_stack_child_is_limited_by_its_role_on_every_cluster(child: str, role: str) -> None:
    assert _multicluster.child_role(child, ["manager", "worker-1", "worker-2"]) == role


class _Group:
    def __init__(self) -> None:
        self.calls: list = []
        self.used, self.periods = 0.0, (0, 0)

    def limit(self, cores) -> None:
        self.calls.append(("limit", cores))

    def add(self, pid: int) -> None:
        self.calls.append(("add", pid))

    def usage_s(self) -> float:
        return self.used

    def throttled(self) -> tuple[int, int]:
        return self.periods


class _Quotas:
    def __init__(self) -> None:
        self.made: dict[str, _Group] = {}

    def group(self, name: str) -> _Group:
        return self.made.setdefault(name, _Group())


def test_a_replica_starts_unlimited_in_its_cgroup_and_a_replacement_reuses_it() -> None:
    unlimited = _quota.LimitedReplicas(0.0)  # no limit: no cgroup, nothing measured, nothing to apply
    unlimited.starting("applier-2", 41)
    unlimited.apply("applier-2")
    assert not unlimited and unlimited.groups == {}
    assert _quota.LimitedReplicas(0.0).snapshot() == {} and _quota.LimitedReplicas(0.0).shares({}, 1.0) == {}
    limits = _quota.LimitedReplicas(0.0)
    limits.cores, limits.quotas = 0.1, _Quotas()
    limits.starting("dispatcher-2", 41)
    group = limits.groups["dispatcher-2"]
    assert group.calls == [("limit", None), ("add", 41)]
    limits.apply()
    assert group.calls[-1] == ("limit", 0.1)
    before = limits.snapshot()
    group.used, group.periods = 0.95, (100, 60)  # 10 s at 0.1 CPU: 1 CPU-second is all of it
    assert limits.shares(before, 10.0) == {"dispatcher-2": pytest.approx((0.95, 0.6))}
    limits.starting("dispatcher-2", 42)  # after a SIGKILL: the same cgroup, lifted while it starts
    assert group.calls[-2:] == [("limit", None), ("add", 42)]
    assert limits.snapshot(["dispatcher-2", "dispatcher-3"]).keys() == {"dispatcher-2"}


def _row(count: int, rate: float, shares: dict, mirrored: float | None = None) -> dict:
    return {"dispatchers": count, "rate": rate, "created_s": 2.0, "wall_s": 100 / rate,
            "mirrored_rate": rate / 2 if mirrored is None else mirrored,
            "dispatcher_cpu_ms": 9.5, "stack_cpu_pct": 150.0, "limits": shares, "conflicts": 0.25 * (count - 1)}


def test_the_dispatcher_table_shows_each_limited_replica_against_its_limit_and_the_target() -> None:
    rows = [_row(1, 10.0, {"dispatcher": (0.97, 0.8)}),
            _row(4, 36.0, {f"dispatcher{suffix}": (0.95, 0.5) for suffix in ("", "-2", "-3")}
                 | {"dispatcher-4": (0.5, 0.0)})]
    lines = _multicluster.dispatcher_table(rows, 100, 0.1, 2)
    assert lines[2].split()[:9] == ["1", "10.0", "1.00", "5.0", "1.00", "50.0", "9.5", "0.00", "150"]
    assert lines[2].endswith("dispatcher 97% (80%); at their limit: dispatcher")
    assert lines[3].split()[:8] == ["4", "36.0", "3.60", "18.0", "3.60", "50.0", "9.5", "0.75"]
    assert "dispatcher-4 50% (0%); at their limit: dispatcher, dispatcher-2, dispatcher-3" in lines[3]
    assert lines[-1] == ("target: delegated TrainJobs/s with 4 dispatchers >= 3.4x one (each limited to 0.1 CPU): "
                         "3.60x met (JobSets on the workers), 3.60x met (copies' state on the manager)")
    assert _multicluster.scale_target([_row(1, 10.0, {}), _row(4, 30.0, {}, mirrored=2.0)], 0.1).endswith(
        "3.00x NOT met (JobSets on the workers), 0.40x NOT met (copies' state on the manager)")
    assert _multicluster.scale_target([_row(1, 10.0, {}), _row(2, 19.0, {})], 0.1) is None
    unlimited = _multicluster.dispatcher_table([_row(1, 10.0, {})], 100, 0.0, 2)
    assert unlimited[0].endswith("stack CPU %") and unlimited[2].endswith(" 150")
