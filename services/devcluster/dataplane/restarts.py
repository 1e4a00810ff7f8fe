"""The kubelet's crash-loop back-off between restarts of a container (pure)."""
from __future__ import annotations

CRASH_BACKOFF_BASE_S = 10.0
CRASH_BACKOFF_MAX_S = 300.0


def crash_backoff_seconds(restart_number: int, scale: float) -> float:
    """Delay before restart N (1-based): the first is immediate, then 10 s doubling, max 300 s."""
    if restart_number <= 1:
        return 0.0
    return min(CRASH_BACKOFF_BASE_S * 2 ** (restart_number - 2), CRASH_BACKOFF_MAX_S) * scale


def backoff_message(delay: float, container: str, pod: str, namespace: str, uid: str) -> str:
    """The waiting message of a container in CrashLoopBackOff, worded as the kubelet's."""
    return f"back-off {_duration(delay)} restarting failed container={container} pod={pod}_{namespace}({uid})"


def _duration(seconds: float) -> str:
    if seconds >= 60:
        minutes, rest = divmod(int(seconds), 60)
        return f"{minutes}m{rest}s"
    return f"{seconds:g}s"
