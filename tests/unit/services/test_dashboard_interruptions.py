"""The dashboard timeline of a TrainJob evicted and re-admitted: the suspended note carries the
step the trainer stopped at, the resumed note the step it went on from."""
from __future__ import annotations

from trainyard_services.dashboard.live import Timeline

T0 = 1767225600.0  # 2026-01-01T00:00:00Z


def _status(step=None, resumed_from=None, at="2026-01-01T00:00:10Z"):
    metrics = [{"name": "loss", "value": "0.5"}]
    if step is not None:
        metrics.append({"name": "step", "value": str(step)})
    if resumed_from is not None:
        metrics.append({"name": "resumedFromStep", "value": str(resumed_from)})
    return {"metrics": metrics, "lastUpdatedTime": at}


def test_suspended_and_resumed_notes_get_their_steps():
    timeline = Timeline()
    timeline.mark("created", T0)
    timeline.mark("running", T0 + 5)
    assert not timeline.note_step(_status(step=12, at="2026-01-01T00:00:09Z"))  # no note yet
    timeline.note("suspended", T0 + 10)
    assert timeline.to_json()[-1]["detail"] == "at step 12"  # the last step reported so far
    assert timeline.note_step(_status(step=18, at="2026-01-01T00:00:10Z"))
    # the report sent while stopping arrives after the condition
    assert timeline.note_step(_status(step=20, at="2026-01-01T00:00:11Z"))
    assert not timeline.note_step(_status(step=20, at="2026-01-01T00:00:11Z"))
    timeline.note("resumed", T0 + 30)
    assert timeline.note_step(_status(step=21, resumed_from=20, at="2026-01-01T00:00:40Z"))
    assert not timeline.note_step(_status(step=30, resumed_from=20, at="2026-01-01T00:00:50Z"))
    timeline.mark("finished", T0 + 60)
    shown = [(e["stage"], e.get("step"), e.get("detail")) for e in timeline.to_json()]
    assert shown == [("created", None, None), ("running", None, None), ("suspended", 20, "at step 20"),
                     ("resumed", 20, "from step 20"), ("finished", None, None)]


# One eviction as the dashboard may see it: the Suspended condition, the report sent while
# stopping (step 14), the TrainJob leaving Suspended, the resumed run's reports. On a busy
# machine the stopping report can be read after the resume (it is only in the TrainJob's status
# until a later write replaces it; the progress stream delivers it on its own subscription), and
# the resumed run's first report can be written before the status service drops the condition.
EVICTION = {
    "suspended": ("note", "suspended", T0 + 20),
    "running report": ("report", _status(step=13, at="2026-01-01T00:00:19Z")),
    "stopping report": ("report", _status(step=14, at="2026-01-01T00:00:21Z")),
    "resumed": ("note", "resumed", T0 + 40),
    "first resumed report": ("report", _status(step=15, resumed_from=14, at="2026-01-01T00:00:39Z")),
    "later resumed report": ("report", _status(step=16, resumed_from=14, at="2026-01-01T00:00:42Z")),
}


def _apply(timeline, what):
    if what[0] == "note":
        timeline.note(what[1], what[2])
    else:
        timeline.note_step(what[1])


def test_the_steps_do_not_depend_on_the_order_the_dashboard_learns_them():
    import itertools
    names = list(EVICTION)
    for order in itertools.permutations(names):
        if order.index("suspended") > order.index("resumed"):
            continue  # the dashboard sees the state change in order (one subscription)
        timeline = Timeline()
        for name in order:
            _apply(timeline, EVICTION[name])
        shown = [(e["stage"], e["detail"]) for e in timeline.to_json()]
        assert shown == [("suspended", "at step 14"), ("resumed", "from step 14")], order


def test_a_dashboard_started_during_a_resumed_run_keeps_that_run_apart():
    """Reports before the first note it saw carry resumedFromStep 8: that run was itself
    resumed; its stopping step is its own last one, and the next run's is told by its own."""
    timeline = Timeline()
    timeline.note_step(_status(step=19, resumed_from=8, at="2026-01-01T00:00:05Z"))
    timeline.note("suspended", T0 + 10)
    timeline.note_step(_status(step=20, resumed_from=8, at="2026-01-01T00:00:11Z"))
    timeline.note("resumed", T0 + 30)
    timeline.note_step(_status(step=21, resumed_from=20, at="2026-01-01T00:00:35Z"))
    assert [(e["stage"], e["detail"]) for e in timeline.to_json()] == [
        ("suspended", "at step 20"), ("resumed", "from step 20")]


def test_without_step_metrics_the_notes_stay_plain():
    timeline = Timeline()
    timeline.note("suspended", T0 + 1)
    assert not timeline.note_step({"metrics": [{"name": "loss", "value": "1"}], "lastUpdatedTime": "2026-01-01T00:00:02Z"})
    timeline.note("resumed", T0 + 2)
    assert not timeline.note_step({})
    assert [(e["stage"], e["step"], e["detail"]) for e in timeline.to_json()] == [
        ("suspended", None, ""), ("resumed", None, "")]
