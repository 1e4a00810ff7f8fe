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
    assert not timeline.note_step(_status(step=12))  # no note yet
    timeline.note("suspended", T0 + 10)
    assert timeline.note_step(_status(step=18))
    # the report sent while stopping arrives after the condition
    assert timeline.note_step(_status(step=20, at="2026-01-01T00:00:11Z"))
    assert not timeline.note_step(_status(step=20, at="2026-01-01T00:00:11Z"))
    timeline.note("resumed", T0 + 30)
    # the last report of the first run does not say where the new run started
    assert not timeline.note_step(_status(step=20, resumed_from=8, at="2026-01-01T00:00:11Z"))
    assert timeline.note_step(_status(step=21, resumed_from=20, at="2026-01-01T00:00:40Z"))
    assert not timeline.note_step(_status(step=30, resumed_from=20, at="2026-01-01T00:00:50Z"))
    timeline.mark("finished", T0 + 60)
    shown = [(e["stage"], e.get("step"), e.get("detail")) for e in timeline.to_json()]
    assert shown == [("created", None, None), ("running", None, None), ("suspended", 20, "at step 20"),
                     ("resumed", 20, "from step 20"), ("finished", None, None)]


def test_without_step_metrics_the_notes_stay_plain():
    timeline = Timeline()
    timeline.note("suspended", T0 + 1)
    assert not timeline.note_step({"metrics": [{"name": "loss", "value": "1"}], "lastUpdatedTime": "2026-01-01T00:00:02Z"})
    timeline.note("resumed", T0 + 2)
    assert not timeline.note_step({})
    assert [(e["stage"], e["step"], e["detail"]) for e in timeline.to_json()] == [
        ("suspended", None, ""), ("resumed", None, "")]
