"""Why a cluster attempt's pod has not started, and when waiting for it ends the attempt.

A pod can wait for ever: for an image that cannot be pulled, a Secret or ConfigMap that
does not exist, a node with room for it, or, when an admission webhook or policy refuses
it, without ever being made. The `kubernetes` and `argo` executors read why (from the
pod's container statuses and conditions, the Job's FailedCreate events, Argo's node
message) and say it in every observation of the waiting attempt; once the pod has waited
`executors.kubernetes.pod_start_timeout` (shortened to the attempt's own deadline less the
margin), the attempt fails with that reason:

| the pod waits for                                   | reason                        | class     |
| --------------------------------------------------- | ----------------------------- | --------- |
| an image that cannot be pulled                      | ErrImagePull, ImagePullBackOff | permanent |
| an image name that is not one (at once, not waited) | InvalidImageName              | permanent |
| a missing Secret, ConfigMap or key                  | CreateContainerConfigError    | permanent |
| no pod: admission (webhook, policy) refused it      | FailedCreate                  | permanent |
| no pod: a full ResourceQuota, anything else         | FailedCreate                  | transient |
| a node (PodScheduled False)                         | Unschedulable                 | transient |
| anything else (volumes, a slow start)               | as the kubelet words it       | transient |

Permanent means retrying cannot help until a person changes something: the job is
quarantined at once. A transient one is retried like any failure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from corral import launching, model

PERMANENT = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
    }
)
"""What a container waits for that no wait will fix (Kubernetes' own words)."""
AT_ONCE = frozenset({"InvalidImageName"})
"""What fails an attempt at once: the kubelet does not even try again."""
STARTING = frozenset({"ContainerCreating", "PodInitializing"})
"""What a container waits in on its way to start: no reason to tell."""
FAILED_CREATE = "FailedCreate"
"""The Job controller's event when the API server refuses the pod it makes."""
NO_POD = "NoPod"
_DENIED = re.compile(
    r"admission webhook .* denied the request|denied request|violates PodSecurity", re.DOTALL
)
"""How the API server words an admission refusal: a webhook's, a ValidatingAdmissionPolicy's,
Pod Security admission's. A full ResourceQuota ("exceeded quota") is none: it frees up."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why an attempt's pod has not started: `reason` as Kubernetes words it, its message,
    and what it says of a retry."""

    reason: str
    message: str | None = None
    failure_class: model.FailureClass = model.FailureClass.TRANSIENT

    @classmethod
    def of(cls, reason: str, message: str | None = None) -> Waiting:
        permanent = reason in PERMANENT or (reason == FAILED_CREATE and denied(message or ""))
        verdict = model.FailureClass.PERMANENT if permanent else model.FailureClass.TRANSIENT
        return cls(reason, _short(message), verdict)

    @property
    def text(self) -> str:
        return f"{self.reason}: {self.message}" if self.message else self.reason


def denied(message: str) -> bool:
    """Whether an API server's message is an admission webhook's or policy's refusal."""
    return bool(_DENIED.search(message))


def started(pod: Mapping[str, Any]) -> bool:
    """Whether a pod's containers have started (or ended): it is past waiting to start."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    return any(
        (c.get("state") or {}).keys() & {"running", "terminated"}
        for c in status.get("containerStatuses") or []
    )


def waiting(pods: Sequence[Mapping[str, Any]]) -> Waiting | None:
    """Why the newest of an attempt's pods waits to start (None: it started). A container
    that waits for something says it first, then a pod that no node takes; a pod with
    nothing to say waits as `Pending`. No pod at all is NO_POD."""
    if not pods:
        return Waiting(NO_POD, "no pod made yet")
    pod = max(pods, key=lambda p: str(p.get("metadata", {}).get("creationTimestamp") or ""))
    if started(pod):
        return None
    status = pod.get("status") or {}
    for container in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        held = (container.get("state") or {}).get("waiting") or {}
        if held.get("reason") and held["reason"] not in STARTING:
            return Waiting.of(str(held["reason"]), held.get("message"))
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return Waiting.of(
                str(condition.get("reason") or "Unschedulable"), condition.get("message")
            )
    for container in status.get("containerStatuses") or []:
        if reason := ((container.get("state") or {}).get("waiting") or {}).get("reason"):
            return Waiting.of(str(reason))
    return Waiting.of("Pending")


def since(pods: Sequence[Mapping[str, Any]]) -> datetime | None:
    """When the newest pod was made (None: no pod): a pod made to replace one lost with
    its node waits from then, not from its Job's start."""
    made = [str(p.get("metadata", {}).get("creationTimestamp") or "") for p in pods]
    newest = max(made, default="")
    if not newest:
        return None
    return datetime.fromisoformat(newest.replace("Z", "+00:00"))


def refused(events: Sequence[Mapping[str, Any]]) -> Waiting | None:
    """The newest FailedCreate among a Job's events (None when there is none): the API
    server refused the pod its controller makes, and says why."""
    failed = [e for e in events if e.get("reason") == FAILED_CREATE]
    if not failed:
        return None
    newest = max(failed, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return Waiting.of(FAILED_CREATE, str(newest.get("message") or ""))


def limit(timeout: timedelta, deadline_seconds: Any, margin: timedelta) -> timedelta:
    """How long a pod may wait to start: `timeout`, or, when the attempt's platform
    deadline (activeDeadlineSeconds) is shorter, that less the margin."""
    if isinstance(deadline_seconds, int | float) and deadline_seconds > 0:
        room = timedelta(seconds=deadline_seconds) - margin
        if room < timeout:
            return max(room, timedelta(seconds=1))
    return timeout


def observation(
    name: str,
    labels: Mapping[str, str],
    why: Waiting,
    *,
    since: datetime | None,
    now: datetime,
    limit: timedelta,
) -> launching.Observation:
    """A waiting attempt as it is now: PENDING, its reason said, or, once it has waited
    `limit` since `since` (or at once, for a reason no wait fixes), FAILED with it."""
    waited = (now - since) if since is not None else timedelta(0)
    if why.reason not in AT_ONCE and waited < limit:
        return launching.Observation(
            name=name,
            phase=launching.Phase.PENDING,
            labels=labels,
            reason=f"waiting to start: {why.reason}",
            message=why.message,
        )
    return launching.Observation(
        name=name,
        phase=launching.Phase.FAILED,
        labels=labels,
        reason=f"pod did not start in {_seconds(waited)}: {why.reason}",
        finished_at=now,
        failure_class=why.failure_class,
        message=why.message,
    )


def _seconds(waited: timedelta) -> str:
    return f"{max(waited.total_seconds(), 0):.0f}s"


def _short(message: Any) -> str | None:
    text = " ".join(str(message or "").split())
    return text[:500] or None
