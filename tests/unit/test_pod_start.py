"""Why a cluster attempt's pod has not started (startup.py), what a Job's pods say of its
success, and the pod start timeout's place in the chain of limits."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.aio import client

from corral import config, errors, launching, model
from corral.executors import (
    argo_observation,
    kube_calls,
    kubernetes_observation,
    kubernetes_settings,
    startup,
)

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
P, T = model.FailureClass.PERMANENT, model.FailureClass.TRANSIENT


def pod(
    status: dict[str, Any], created: str = "2026-12-06T11:59:00Z", **meta: Any
) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": created, **meta}, "status": status}


def container(state: dict[str, Any]) -> dict[str, Any]:
    return {"name": "main", "state": state}


def held(reason: str, message: str = "") -> dict[str, Any]:
    return pod(
        {
            "phase": "Pending",
            "containerStatuses": [container({"waiting": {"reason": reason, "message": message}})],
        }
    )


@pytest.mark.parametrize(
    ("reason", "verdict"),
    [
        ("ErrImagePull", P),
        ("ImagePullBackOff", P),
        ("InvalidImageName", P),
        ("CreateContainerConfigError", P),
        ("CrashLoopBackOff", T),
    ],
)
def test_a_container_waiting_says_why_and_what_a_retry_can_do(
    reason: str, verdict: model.FailureClass
) -> None:
    why = startup.waiting([held(reason, "  details\n of it ")])
    assert why == startup.Waiting(reason, "details of it", verdict)


def test_no_node_is_unschedulable_and_transient() -> None:
    scheduled = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes",
    }
    why = startup.waiting([pod({"phase": "Pending", "conditions": [scheduled]})])
    assert why == startup.Waiting("Unschedulable", "0/3 nodes", T)


def test_a_pod_on_its_way_or_started() -> None:
    assert startup.waiting([held("ContainerCreating")]) == startup.Waiting("ContainerCreating")
    assert startup.waiting([pod({"phase": "Pending"})]) == startup.Waiting("Pending")
    assert startup.waiting([]) == startup.Waiting(startup.NO_POD, "no pod made yet")
    running = pod({"phase": "Running", "containerStatuses": [container({"running": {}})]})
    assert startup.waiting([running]) is None
    newer = held("ErrImagePull")
    newer["metadata"]["creationTimestamp"] = "2026-12-06T11:59:30Z"
    assert startup.waiting([running, newer]) is not None, "the newest pod is the one that counts"


def test_failed_create_is_permanent_only_when_admission_refused() -> None:
    def event(message: str, at: str = "2026-12-06T11:59:00Z") -> dict[str, Any]:
        return {"reason": "FailedCreate", "message": message, "lastTimestamp": at}

    webhook = 'Error creating: admission webhook "policy.example.com" denied the request: no root'
    quota = 'Error creating: pods "x" is forbidden: exceeded quota: compute, requested: cpu=1'
    policy = 'Error creating: pods "x" is forbidden: violates PodSecurity "restricted:latest"'
    assert startup.refused([event(webhook)]) == startup.Waiting("FailedCreate", webhook, P)
    assert startup.refused([event(policy)]) == startup.Waiting("FailedCreate", policy, P)
    assert startup.refused([event(quota)]) == startup.Waiting("FailedCreate", quota, T)
    newest = startup.refused([event(webhook), event(quota, "2026-12-06T11:59:30Z")])
    assert newest is not None
    assert newest.failure_class is T
    assert startup.refused([{"reason": "SuccessfulCreate"}]) is None


def test_waiting_is_pending_until_the_limit_then_failed() -> None:
    why = startup.Waiting("ErrImagePull", "not found", P)
    since = NOW - timedelta(seconds=30)
    before = startup.observation("a", {}, why, since=since, now=NOW, limit=timedelta(seconds=31))
    assert (before.phase, before.reason, before.message) == (
        launching.Phase.PENDING,
        "waiting to start: ErrImagePull",
        "not found",
    )
    after = startup.observation("a", {}, why, since=since, now=NOW, limit=timedelta(seconds=30))
    assert (after.phase, after.failure_class, after.reason) == (
        launching.Phase.FAILED,
        P,
        "pod did not start in 30s: ErrImagePull",
    )
    at_once = startup.Waiting("InvalidImageName", None, P)
    now = startup.observation("a", {}, at_once, since=NOW, now=NOW, limit=timedelta(hours=1))
    assert now.phase is launching.Phase.FAILED


def test_a_shorter_deadline_shortens_the_wait() -> None:
    two, five = timedelta(minutes=2), timedelta(seconds=5)
    assert startup.limit(two, 60, five) == timedelta(seconds=55)
    assert startup.limit(two, 7200, five) == two
    assert startup.limit(two, None, five) == two


# --- successes after a disruption ------------------------------------------------------------------


def complete_job(deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "a", "uid": "u"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T12:00:00Z"
    condition = {"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-06T12:00:00Z"}
    return {"metadata": meta, "status": {"conditions": [condition]}}


def succeeded(*conditions: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return pod({"phase": "Succeeded", "conditions": list(conditions)}, **meta)


def test_a_success_after_a_disruption_is_not_trusted() -> None:
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    obs = kubernetes_observation.job_observation(complete_job(), [succeeded(disruption)])
    assert (obs.phase, obs.failure_class) == (launching.Phase.FAILED, T)
    assert (
        obs.reason
        == "success not trusted: its pod exited 0 after a disruption (PreemptionByScheduler)"
    )
    gone = kubernetes_observation.job_observation(complete_job(), [])
    assert (gone.phase, gone.failure_class) == (launching.Phase.FAILED, T)
    deleting = succeeded(deletionTimestamp="2026-12-06T12:00:00Z")
    assert (
        kubernetes_observation.job_observation(complete_job(), [deleting]).phase
        is launching.Phase.FAILED
    )


def test_an_undisturbed_success_is_trusted() -> None:
    assert (
        kubernetes_observation.job_observation(complete_job(), [succeeded()]).phase
        is launching.Phase.SUCCEEDED
    )
    ttl = kubernetes_observation.job_observation(complete_job(deleting=True), [])
    assert ttl.phase is launching.Phase.SUCCEEDED, "its TTL deletes the Job and its pods together"


# --- refusals at create ---------------------------------------------------------------------------


def forbidden(message: str) -> client.ApiException:
    body = json.dumps({"kind": "Status", "code": 403, "reason": "Forbidden", "message": message})
    return client.ApiException(status=403, reason="Forbidden", body=body)


def test_a_job_refused_by_admission_is_refused_for_good() -> None:
    webhook = 'admission webhook "validation.gatekeeper.sh" denied the request: [labels] team'
    refused = kube_calls.translate(forbidden(webhook), "creating Job default/a")
    assert isinstance(refused, errors.LaunchRefused)
    assert "[labels] team" in str(refused)
    quota = 'jobs "a" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1'
    full = kube_calls.translate(forbidden(quota), "creating Job default/a")
    assert not isinstance(full, errors.LaunchRefused), "a quota frees up"
    assert "ResourceQuota" in str(full)
    assert "Role" not in str(full)
    role = kube_calls.translate(forbidden('jobs is forbidden: User "x" cannot create'), "x")
    assert "Role" in str(role)


# --- the chain ---------------------------------------------------------------------------------


def test_the_pod_start_timeout_follows_the_attempt_deadline_down() -> None:
    assert config.Settings().pod_start_timeout == kubernetes_settings.POD_START_TIMEOUT
    short = config.Settings(timeouts={"attempt_deadline": "20s"})
    assert short.pod_start_timeout == timedelta(seconds=15)
    given = config.Settings(executors={"kubernetes": {"pod_start_timeout": "10s"}})
    assert given.pod_start_timeout == timedelta(seconds=10)


def test_a_pod_start_timeout_past_the_attempt_deadline_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"executors.kubernetes.pod_start_timeout \(300s\) must be"
    ):
        config.Settings(executors={"kubernetes": {"pod_start_timeout": "5m"}})


def test_a_replacement_pod_waits_from_when_it_was_made() -> None:
    first = pod({"phase": "Failed"}, created="2026-12-06T11:00:00Z")
    second = held("ErrImagePull")
    assert startup.since([first, second]) == datetime(2026, 12, 6, 11, 59, tzinfo=UTC)
    assert startup.since([]) is None


def workflow(phase: str, node: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if node is not None:
        status["nodes"] = {"wf": {"type": "Pod", **node}}
    return {"metadata": {"name": "wf"}, "status": status}


def test_argo_reads_why_its_pod_waits_from_the_node_message() -> None:
    pulling = {"phase": "Pending", "message": "ImagePullBackOff: Back-off pulling image"}
    assert argo_observation.pod_waiting(workflow("Running", pulling)) == startup.Waiting(
        "ImagePullBackOff", "Back-off pulling image", P
    )
    assert argo_observation.pod_waiting(workflow("Pending")) == startup.Waiting("Pending")
    assert argo_observation.pod_waiting(workflow("Running")) is None, (
        "running, no node yet: trusted"
    )
    assert argo_observation.pod_waiting(workflow("Running", {"phase": "Running"})) is None
    assert argo_observation.pod_waiting(workflow("Failed", pulling)) is None
