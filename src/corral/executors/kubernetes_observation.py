"""What a Kubernetes Job and its pods say of an attempt: pure reading of the objects the
API server returned, apart from the calls that fetch them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from corral import launching, model
from corral.executors import kube_client, kube_objects

_FINAL = ("Complete", "Failed")


def job_observation(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> launching.Observation:
    """What a Job (and, when it finished, its pods) says of its attempt.

    Success is the `Complete` condition, from a pod that succeeded undisturbed: one with
    a DisruptionTarget condition (evicted, preempted, its node drained: it trapped
    SIGTERM and exited 0), or gone by then (deleted before its Job counted it), is not
    trusted, and fails transient. `Failed` reads the pod that failed last for the exit
    code, the termination reason (OOMKilled, Error...) and the last line of its
    termination message; DeadlineExceeded, pod disruptions (a node lost, an eviction)
    and a pod deleted under its Job (`kubectl delete pod`) are transient. Any number of
    pods is still one attempt. Until `Complete` or `Failed` the attempt has not ended, even
    once the Job's end is decided (SuccessCriteriaMet, FailureTarget): its pods may still
    run. It is RUNNING while a pod is ready, or Running though terminating (no longer
    counted ready, but running on in its grace)."""
    meta, status = job.get("metadata", {}), job.get("status") or {}
    seen = launching.Observation(
        name=str(meta.get("name", "")),
        phase=launching.Phase.PENDING,
        labels=kube_objects.labels_of(job),
        started_at=kube_objects.timestamp(status.get("startTime")),
    )
    if (complete := _condition(job, "Complete")) is not None:
        completed = kube_objects.timestamp(
            status.get("completionTime") or complete.get("lastTransitionTime")
        )
        return _completed(seen, job, pods, completed)
    if (failed := _condition(job, "Failed")) is not None:
        return _failed(seen, failed, pods)
    running = int(status.get("ready") or 0) > 0 or any(
        (pod.get("status") or {}).get("phase") == "Running" for pod in pods
    )
    return dataclasses.replace(seen, phase=launching.Phase.RUNNING) if running else seen


def _completed(
    seen: launching.Observation,
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    completed: datetime | None,
) -> launching.Observation:
    """A Complete Job's attempt: succeeded, unless its success is not to be trusted."""
    if (doubt := _untrusted(job, pods)) is not None:
        return dataclasses.replace(
            seen,
            phase=launching.Phase.FAILED,
            reason=f"success not trusted: {doubt}",
            finished_at=completed,
            failure_class=_TRANSIENT,
        )
    return dataclasses.replace(
        seen, phase=launching.Phase.SUCCEEDED, exit_code=0, finished_at=completed
    )


def _failed(
    seen: launching.Observation, failed: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> launching.Observation:
    """A Failed Job's attempt, read from the pod that failed last."""
    pod = _last_failed(pods)
    terminated = _terminated(pod)
    exit_code = terminated.get("exitCode") if terminated else None
    reason, verdict = _failure(str(failed.get("reason") or "Failed"), pod, terminated)
    return dataclasses.replace(
        seen,
        phase=launching.Phase.FAILED,
        exit_code=int(exit_code) if exit_code is not None else None,
        reason=reason,
        finished_at=kube_objects.timestamp(failed.get("lastTransitionTime")),
        failure_class=verdict,
        message=kube_objects.last_line(terminated.get("message")) if terminated else None,
    )


def _failure(
    why: str, pod: Mapping[str, Any] | None, terminated: Mapping[str, Any]
) -> tuple[str, model.FailureClass | None]:
    """The reason a Job failed (`why`, its Failed condition's), and its class when the
    platform knows it: the deadline, a disruption and a deleted pod are transient."""
    if why == "DeadlineExceeded":
        return "deadline exceeded: the Job ran past activeDeadlineSeconds", _TRANSIENT
    if pod is not None and (disruption := _condition(pod, "DisruptionTarget")) is not None:
        return f"pod disrupted: {disruption.get('reason') or 'DisruptionTarget'}", _TRANSIENT
    if pod is not None and pod.get("metadata", {}).get("deletionTimestamp"):
        ended = terminated.get("reason") or "Error"
        return f"pod deleted: it ended {ended} on SIGTERM", _TRANSIENT
    if terminated:
        return str(terminated.get("reason") or "Error"), None
    if pod is None:
        # A failed pod stays while its Job does: one gone was deleted (`kubectl delete
        # pod`, a drain), ended by that, and its own exit code is lost.
        return f"Job failed ({why}); its pod is gone, so no exit code", _TRANSIENT
    return f"Job failed ({why}): {pod.get('status', {}).get('reason') or 'pod failed'}", None


_TRANSIENT = model.FailureClass.TRANSIENT


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cast(Mapping[str, Any], cond)
    return None


def _untrusted(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a Complete Job's success is not to be trusted, or None: its succeeded pod
    was disrupted, or is gone (a pod that ends on its own stays as long as its Job, so one
    gone was deleted, evicted or preempted, and its Job counted it as it went). The cost:
    a success read only after the pod garbage collector removed its pod (a cluster with a
    low terminated-pod-gc-threshold, read late by recovery) is run again."""
    phases = [(p, (p.get("status") or {}).get("phase")) for p in pods]
    for pod, phase in phases:
        if phase != "Succeeded":
            continue
        if (disruption := _condition(pod, "DisruptionTarget")) is not None:
            why = disruption.get("reason") or "DisruptionTarget"
            return f"its pod exited 0 after a disruption ({why})"
        if pod.get("metadata", {}).get("deletionTimestamp"):
            return "its pod exited 0 while being deleted"
    if all(phase == "Failed" for _, phase in phases) and not job.get("metadata", {}).get(
        "deletionTimestamp"
    ):
        return "its pod was deleted (evicted, preempted, drained) before its Job counted it"
    return None


def container_started(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's main container has started (so it has a log to follow)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == kube_client.CONTAINER:
            return bool(set(status.get("state") or {}) & {"running", "terminated"})
    return False


def logged_pod(found: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod whose log is the attempt's: the one that succeeded, else the last failed."""
    done = [p for p in found if (p.get("status") or {}).get("phase") == "Succeeded"]
    return done[-1] if done else _last_failed(found)


def job_decided(job: Mapping[str, Any]) -> bool:
    """Whether the Job's end is decided (FailureTarget, SuccessCriteriaMet) while its pods
    end: Complete or Failed follows once none runs."""
    return any(_condition(job, kind) is not None for kind in _DECIDED)


_DECIDED = ("FailureTarget", "SuccessCriteriaMet")


def needs_pods(job: Mapping[str, Any]) -> bool:
    """Whether what a Job says needs its pods read: it has finished (how its pod ended), or
    none of its pods is ready (why it waits to start)."""
    return job_finished(job) or int((job.get("status") or {}).get("ready") or 0) == 0


def may_need_pods(job: Mapping[str, Any]) -> bool:
    """`needs_pods`, False for a malformed Job (its own observation says it is unknown)."""
    try:
        return needs_pods(job)
    except (AttributeError, TypeError, ValueError):
        return False


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def job_finished(job: Mapping[str, Any]) -> bool:
    return any(_condition(job, kind) is not None for kind in _FINAL)


def _last_failed(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    failed.sort(key=lambda p: str(p.get("metadata", {}).get("creationTimestamp") or ""))
    return failed[-1] if failed else (pods[-1] if pods else None)


def _terminated(pod: Mapping[str, Any] | None) -> dict[str, Any]:
    if pod is None:
        return {}
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == kube_client.CONTAINER:
            return dict((status.get("state") or {}).get("terminated") or {})
    return {}
