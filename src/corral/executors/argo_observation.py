"""What an Argo Workflow says of its attempt (pure): its phase, its pod node's exit code and
message, and why its pod waits to start. Only the controller's own words are read for a
verdict.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, cast

from corral import launching, model
from corral.executors import kube_objects, startup

_PHASES = {
    "": launching.Phase.PENDING,
    "Pending": launching.Phase.PENDING,
    "Running": launching.Phase.RUNNING,
    "Succeeded": launching.Phase.SUCCEEDED,
    "Failed": launching.Phase.FAILED,
    "Error": launching.Phase.FAILED,
}


_REASON = re.compile(r"^([A-Z][A-Za-z]+): (.*)$", re.DOTALL)
"""Argo's message on a pod node that waits: the kubelet's or scheduler's reason, then its
message ("ImagePullBackOff: Back-off pulling image ...", "Unschedulable: 0/3 nodes ...")."""


def pod_waiting(wf: Mapping[str, Any]) -> startup.Waiting | None:
    """Why the Workflow's pod waits to start, from its pod node (None: it started, or
    it is not known to wait): Argo copies the pod's reason and message onto the node."""
    status = wf.get("status") or {}
    node = _pod_node(status)
    if not node:  # no word of its pod yet: waiting only while the Workflow is
        pending = _PHASES.get(str(status.get("phase") or "")) is launching.Phase.PENDING
        return startup.Waiting.of("Pending") if pending else None
    if node.get("phase") != "Pending" or status.get("phase") not in ("Pending", "Running"):
        return None
    said = str(node.get("message") or "")
    if (found := _REASON.match(said)) is not None:
        return startup.Waiting.of(found.group(1), found.group(2))
    return startup.Waiting.of("Pending", said or None)


DEADLINE = "Step exceeded its deadline"
"""What Argo's controller writes on a node stopped at activeDeadlineSeconds."""
POD_DELETED = "pod deleted"
"""What it writes on a node whose pod went away under it (the node's phase: Error)."""
STOPPED = "Stopped with strategy"
"""The start of what it writes on a Workflow stopped by `spec.shutdown`."""
INVALID = "invalid spec:"
"""The start of what it writes on a Workflow its validation refuses (it fails it, and makes
no pod): Argo's CRDs are minimal, so the API server took it in."""


def workflow_observation(wf: Mapping[str, Any]) -> launching.Observation:
    """What a Workflow says of its attempt: `status.phase`, and its pod node's exit code
    and message.

    Only the controller's own words are read for a verdict, and only whole: a node's
    message may be the container's last log lines, which say whatever the job printed.
    A deadline and an `Error` node with no exit code (the pod deleted, a node lost) are
    transient; a stop by `spec.shutdown` is a cancel; a Workflow the controller refused as
    invalid is permanent (the same Workflow is refused again), its words the message."""
    meta, status = wf.get("metadata", {}), wf.get("status") or {}
    phase = _PHASES.get(str(status.get("phase") or ""), launching.Phase.PENDING)
    seen = launching.Observation(
        name=str(meta.get("name", "")),
        phase=phase,
        labels=kube_objects.labels_of(wf),
        started_at=kube_objects.timestamp(status.get("startedAt")),
    )
    if not phase.finished:
        return seen
    seen = dataclasses.replace(seen, finished_at=kube_objects.timestamp(status.get("finishedAt")))
    if phase is launching.Phase.SUCCEEDED:
        return dataclasses.replace(seen, exit_code=0)
    node = _pod_node(status)
    raw_code = str((node.get("outputs") or {}).get("exitCode") or "")
    code = int(raw_code) if raw_code.lstrip("-").isdigit() else None
    reason, verdict, message = _failure(status, node, code)
    return dataclasses.replace(
        seen, exit_code=code, reason=reason, failure_class=verdict, message=message
    )


def _failure(
    status: Mapping[str, Any], node: Mapping[str, Any], code: int | None
) -> tuple[str, model.FailureClass | None, str | None]:
    """The reason, class and message of a failed Workflow, from its controller's words
    (`status.message`) and its pod node's (`node`, whose exit code is `code`)."""
    said = str(node.get("message") or "")
    told = str(status.get("message") or "")
    message = kube_objects.last_line(said) if code is not None else None
    if DEADLINE in (said, told):
        return f"deadline exceeded: {DEADLINE}", model.FailureClass.TRANSIENT, message
    if told.startswith(STOPPED):
        return f"cancelled: {told}", None, message
    if told.startswith(INVALID):
        return f"Workflow refused by Argo: {told}", model.FailureClass.PERMANENT, told
    if node.get("phase") == "Error" and code is None and startup.denied(said or told):
        why = f"pod refused by admission: {said or told}"
        return why, model.FailureClass.PERMANENT, message
    if node.get("phase") == "Error" and code is None:
        return f"{said or told or 'Argo error'}", model.FailureClass.TRANSIENT, message
    reason = f"workflow {status.get('phase')}" + (f" (exit code {code})" if code else "")
    return reason, None, message


def _pod_node(status: Mapping[str, Any]) -> Mapping[str, Any]:
    nodes = [n for n in (status.get("nodes") or {}).values() if n.get("type") == "Pod"]
    return cast(Mapping[str, Any], nodes[-1]) if nodes else {}
