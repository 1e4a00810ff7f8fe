"""Pod status as a kubelet reports it, computed from the runner's container records (pure)."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

CONDITION_ORDER = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                   "PodScheduled")


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerRecord:
    """What the runner knows about one container of a pod."""

    name: str
    image: str = ""
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    container_id: str = ""
    restart_count: int = 0
    last_terminated: dict[str, Any] | None = None
    ready: bool = False
    ever_started: bool = False
    will_restart: bool = False

    def terminated_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"exitCode": self.exit_code if self.exit_code is not None else 0,
                                 "reason": self.reason}
        if self.message:
            state["message"] = self.message
        if self.started_at:
            state["startedAt"] = self.started_at
        state["finishedAt"] = self.finished_at or now_rfc3339()
        if self.container_id:
            state["containerID"] = self.container_id
        if self.signal:
            state["signal"] = self.signal
        return state

    def status(self) -> dict[str, Any]:
        if self.state == "running":
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {"terminated": self.terminated_state()}
        else:
            waiting: dict[str, Any] = {"reason": self.reason}
            if self.message:
                waiting["message"] = self.message
            state = {"waiting": waiting}
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": bool(self.ready and self.state == "running"),
            "restartCount": self.restart_count,
            "started": self.state == "running",
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def _names(records: Iterable[ContainerRecord]) -> str:
    return "[" + " ".join(record.name for record in records) + "]"


def pod_phase(restart_policy: str, init: list[ContainerRecord], regular: list[ContainerRecord],
              terminating: bool = False) -> str:
    """Phase per the kubelet's rules; ``terminating`` means no further restarts will happen."""
    for record in init:
        if record.state == "terminated" and record.exit_code not in (0, None) and (
                restart_policy == "Never" or terminating):
            return "Failed"
    all_init_done = all(r.state == "terminated" and r.exit_code == 0 for r in init)
    if not all_init_done or not all(r.ever_started or r.state == "terminated" for r in regular):
        return "Failed" if terminating else "Pending"
    if any(r.state == "running" for r in regular):
        return "Running"
    if any(r.will_restart and not terminating for r in regular):
        return "Running"
    if any(r.state != "terminated" for r in regular):
        return "Failed" if terminating else "Running"
    if all(r.exit_code == 0 for r in regular):
        return "Succeeded"
    if restart_policy == "Never" or terminating:
        return "Failed"
    return "Running"


def pod_conditions(phase: str, init: list[ContainerRecord], regular: list[ContainerRecord],
                   sandbox_ready: bool) -> list[dict[str, Any]]:
    """Conditions without times, in the kubelet's order (PodScheduled appended by the caller)."""
    terminal = phase in ("Succeeded", "Failed")
    conditions: list[dict[str, Any]] = [
        {"type": "PodReadyToStartContainers",
         "status": "True" if sandbox_ready and not terminal else "False"}]
    incomplete = [r for r in init if not (r.state == "terminated" and r.exit_code == 0)]
    if phase == "Succeeded":
        conditions.append({"type": "Initialized", "status": "True", "reason": "PodCompleted"})
    elif not incomplete:
        conditions.append({"type": "Initialized", "status": "True"})
    else:
        conditions.append({"type": "Initialized", "status": "False",
                           "reason": "ContainersNotInitialized",
                           "message": f"containers with incomplete status: {_names(incomplete)}"})
    if terminal:
        reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        ready: dict[str, Any] = {"status": "False", "reason": reason}
    else:
        unready = [r for r in regular if not (r.ready and r.state == "running")]
        if unready:
            ready = {"status": "False", "reason": "ContainersNotReady",
                     "message": f"containers with unready status: {_names(unready)}"}
        else:
            ready = {"status": "True"}
    conditions.append({"type": "Ready", **ready})
    conditions.append({"type": "ContainersReady", **ready})
    return conditions


def stamp_conditions(new: list[dict[str, Any]], old: list[dict[str, Any]] | None,
                     now: str) -> list[dict[str, Any]]:
    """Add ``lastProbeTime: null`` and a ``lastTransitionTime`` that moves only on status change."""
    previous = {c.get("type"): c for c in old or []}
    stamped = []
    for condition in new:
        before = previous.get(condition["type"])
        moved = before is None or before.get("status") != condition["status"]
        stamped.append({**condition, "lastProbeTime": None,
                        "lastTransitionTime": now if moved else before.get("lastTransitionTime", now)})
    return stamped


@dataclass
class PodView:
    """Everything needed to render one pod's status."""

    restart_policy: str
    init: list[ContainerRecord]
    regular: list[ContainerRecord]
    sandbox_ready: bool = False
    terminating: bool = False
    pod_ip: str = ""
    host_ip: str = ""
    start_time: str | None = None
    qos_class: str = "BestEffort"
    reason: str = ""
    message: str = ""
    scheduled: dict[str, Any] = field(default_factory=dict)


def render_status(view: PodView, old_status: dict[str, Any] | None, now: str) -> dict[str, Any]:
    phase = pod_phase(view.restart_policy, view.init, view.regular, view.terminating)
    if view.reason == "DeadlineExceeded":
        phase = "Failed"
    old_status = old_status or {}
    conditions = stamp_conditions(pod_conditions(phase, view.init, view.regular,
                                                 view.sandbox_ready),
                                  old_status.get("conditions"), now)
    scheduled = view.scheduled or next(
        (c for c in old_status.get("conditions") or []
         if c.get("type") == "PodScheduled" and c.get("status") == "True"),
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
         "lastTransitionTime": now})
    conditions.append(scheduled)
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "qosClass": view.qos_class,
        "containerStatuses": [r.status() for r in view.regular],
    }
    if view.init:
        status["initContainerStatuses"] = [r.status() for r in view.init]
    if view.start_time:
        status["startTime"] = view.start_time
    if view.host_ip:
        status["hostIP"] = view.host_ip
        status["hostIPs"] = [{"ip": view.host_ip}]
    if view.pod_ip:
        status["podIP"] = view.pod_ip
        status["podIPs"] = [{"ip": view.pod_ip}]
    if view.reason:
        status["reason"] = view.reason
    if view.message:
        status["message"] = view.message
    return status
