"""The Workflows the `argo` executor creates: their fields, and that every one of them reads
back unchanged through hera's models of the Argo Workflow and keeps the API server's rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import client, config, errors, launching, model
from corral.executors import argo, argo_manifest, argo_observation, kubernetes, kubernetes_manifest
from tests.unit.test_kubernetes_jobs import (
    ATTEMPT_KEY,
    LARGE,
    MOUNTED_FILE,
    NOW,
    SMALL,
    api_settings,
    make_settings,
)


def workflow(spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
    s = kw.pop("settings", None) or make_settings()
    new = model.NewJob(executor="argo", spec=argo.WorkflowTemplate(s).validate_spec(spec), **kw)
    return argo.dry_run(new, s, NOW)


def test_a_workflow_carries_corrals_rules_labels_and_environment() -> None:
    doc = workflow(
        {"image": "busybox:1.36", "command": ["sh", "-c", "echo hi"], "env": {"MODE": "x"}},
        labels={"team": "data"},
        queue="etl",
        policy={"limits": {"attempt_deadline": 90.5}},
    )
    spec, meta = doc["spec"], doc["metadata"]
    assert (doc["apiVersion"], doc["kind"]) == ("argoproj.io/v1alpha1", "Workflow")
    assert (meta["name"], meta["namespace"]) == ("corral-0-1", "jobs")
    assert "generateName" not in meta, "the name is the launch's: a second launch collides"
    assert spec["activeDeadlineSeconds"] == 91, "the job's own deadline, whole seconds up"
    assert spec["ttlStrategy"] == {"secondsAfterCompletion": 86400}
    assert spec["podGC"] == {"strategy": "OnPodCompletion", "deleteDelayDuration": "120s"}, (
        "the Workflow keeps the outcome; its pod stays two minutes, for its log"
    )
    assert "serviceAccountName" not in spec
    labels = meta["labels"]
    assert labels == spec["podMetadata"]["labels"], "the pods carry them too"
    assert labels["team"] == "data"
    assert model.identity_from_labels(labels) == model.Identity(0, 1, 0)
    assert labels[model.CAPABILITY] == "etl"
    [template] = spec["templates"]
    assert spec["entrypoint"] == template["name"] == "main"
    assert template["retryStrategy"] == {"limit": 0}, "corral owns retries"
    assert json.loads(template["podSpecPatch"]) == {"terminationGracePeriodSeconds": 30}
    env = {e["name"]: e.get("value") for e in template["container"]["env"]}
    assert env["MODE"] == "x"
    assert (env["CORRAL_JOB_ID"], env["CORRAL_ATTEMPT"], env["CORRAL_FENCE"]) == ("0", "1", "0")
    assert "CORRAL_DATABASE_URL" not in env, "never a database URL in the clear"
    argo_manifest.check_workflow(doc)


def test_the_container_is_the_one_a_kubernetes_job_would_run() -> None:
    spec = {
        "image": "busybox",
        "command": ["true"],
        "env": {"A": "1"},
        "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}},
    }
    s = make_settings(database_url_secret="corral-db/url")
    new = model.NewJob(executor="argo", spec=spec)
    job = kubernetes.dry_run(new, s, NOW)
    [template] = workflow(spec, settings=s)["spec"]["templates"]
    assert template["container"] == job["spec"]["template"]["spec"]["containers"][0]


def test_long_values_are_hashed_in_labels_and_kept_whole_in_annotations() -> None:
    tenant = "acme-" + "x" * 80
    doc = workflow({"image": "busybox", "command": ["true"]}, tenant=tenant, idempotency_key="a b")
    labels, notes = doc["metadata"]["labels"], doc["metadata"]["annotations"]
    assert labels[model.TENANT].startswith("h-")
    assert doc["spec"]["podMetadata"]["labels"][model.TENANT] == labels[model.TENANT]
    assert notes == {model.TENANT: tenant, model.IDEMPOTENCY_KEY: "a b"}
    argo_manifest.check_workflow(doc)


def test_placement_classes_the_service_account_and_the_database_secret() -> None:
    s = make_settings(
        database_url_secret="corral-db/url",
        service_account="runner",
        allowed_service_accounts=["runner", "etl"],
        termination_grace="45s",
    ).model_copy(update={"jobs_get_database_url": True})  # the Secret is honoured only so
    batch = workflow({"image": "busybox", "command": ["true"], "placement": "batch"}, settings=s)
    [template] = batch["spec"]["templates"]
    assert template["nodeSelector"] == {"pool": "spot"}
    assert template["tolerations"] == [
        {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "priorityClassName" not in template
    assert batch["spec"]["serviceAccountName"] == "runner"
    assert json.loads(template["podSpecPatch"]) == {"terminationGracePeriodSeconds": 45}
    [secret] = [e for e in template["container"]["env"] if e["name"] == "CORRAL_DATABASE_URL"]
    assert secret == {
        "name": "CORRAL_DATABASE_URL",
        "valueFrom": {"secretKeyRef": {"name": "corral-db", "key": "url"}},
    }
    critical = workflow(
        {
            "image": "busybox",
            "command": ["true"],
            "placement": "critical",
            "service_account": "etl",
        },
        settings=s,
    )
    [template] = critical["spec"]["templates"]
    assert template["priorityClassName"] == "high"
    assert critical["spec"]["serviceAccountName"] == "etl"
    argo_manifest.check_workflow(batch)
    argo_manifest.check_workflow(critical)


def test_the_default_placement_applies_to_jobs_that_name_none() -> None:
    doc = workflow(
        {"image": "busybox", "command": ["true"]}, settings=make_settings(default_placement="batch")
    )
    assert doc["spec"]["templates"][0]["nodeSelector"] == {"pool": "spot"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"command": ["true"]}, "image: required"),
        ({"image": "busybox"}, "command: required"),
        (
            {"image": "busybox", "command": ["true"], "placement": "gpu"},
            "placement: unknown placement class 'gpu' (batch, critical)",
        ),
        ({"image": "busybox", "command": ["true"], "env": {"CORRAL_FENCE": "9"}}, "set by corral"),
        (
            {"image": "busybox", "command": ["true"], "resources": {"requests": {"cpu": "lots"}}},
            "resources.requests.cpu: 'lots' is not a quantity",
        ),
        ({"image": "busybox", "command": ["true"], "service_account": "Bad_Name"}, "DNS-1123"),
        ({"image": "busybox", "command": ["true"], "templates": []}, "templates: unknown field"),
        ("busybox", "spec: must be a JSON object"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(spec: Any, message: str) -> None:
    with pytest.raises(errors.InvalidInput) as caught:
        argo.WorkflowTemplate(make_settings()).validate_spec(spec)
    assert str(caught.value).startswith("argo spec: ")
    assert message in str(caught.value)


def good_doc() -> dict[str, Any]:
    return workflow({"image": "busybox", "command": ["true"]})


def template_of(doc: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = doc["spec"]["templates"][0]
    return template


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: template_of(d).update(bogus=1), "spec.templates.0.bogus: unknown field"),
        (lambda d: d["spec"].update(backoffLimit=0), "spec.backoffLimit: unknown field"),
        (
            lambda d: template_of(d)["container"].update(imagePullPolicyy="Always"),
            "spec.templates.0.container.imagePullPolicyy: unknown field",
        ),
        (
            lambda d: d["spec"].update(
                active_deadline_seconds=d["spec"].pop("activeDeadlineSeconds")
            ),
            "spec.active_deadline_seconds: unknown field",
        ),
        (
            lambda d: d["spec"].update(activeDeadlineSeconds="120"),
            "spec.activeDeadlineSeconds: Input should be a valid integer",
        ),
        (
            lambda d: d["spec"].update(activeDeadlineSeconds=True),
            "spec.activeDeadlineSeconds: Input should be a valid integer",
        ),
        (lambda d: d.update(kind="CronWorkflow"), "must be argoproj.io/v1alpha1/Workflow"),
        (lambda d: d["metadata"].update(name="Corral-1-1"), "must be a DNS-1123 label"),
        (lambda d: d["metadata"].update(name="corral-" + "1" * 60), "at most 63 characters"),
        (lambda d: d["metadata"]["labels"].update(team="has space"), "label team='has space'"),
        (
            lambda d: d["spec"]["podMetadata"]["labels"].update(team="has space"),
            "spec.podMetadata.labels: label team='has space'",
        ),
        (
            lambda d: d["metadata"]["labels"].update({"workflows.argoproj.io/completed": "true"}),
            "is Argo's own",
        ),
    ],
)
def test_the_workflow_check_catches_what_argo_would_refuse_or_misread(
    change: Any, message: str
) -> None:
    doc = good_doc()
    argo_manifest.check_workflow(doc)
    change(doc)
    with pytest.raises(errors.InvalidInput, match=message):
        argo_manifest.check_workflow(doc)


def test_a_placement_removed_from_the_settings_is_a_clear_launch_error() -> None:
    template = argo.WorkflowTemplate(make_settings())
    spec = template.validate_spec({"image": "busybox", "command": ["true"], "placement": "batch"})
    launch = kubernetes_manifest.placeholder_launch(spec, kind=argo.KIND)
    with pytest.raises(errors.ExecutorError, match="'batch' is no longer in the settings"):
        argo.WorkflowTemplate(config.Settings()).manifest(launch, spec)


def test_a_heartbeat_job_must_be_able_to_reach_corral() -> None:
    new = model.NewJob(
        executor="argo",
        spec={"image": "busybox", "command": ["true"]},
        policy={"heartbeat": True},
    )
    s = make_settings()
    with pytest.raises(errors.InvalidInput, match="cannot reach corral to send heartbeats"):
        client.checks.check_job(new, executors={"argo": argo.WorkflowTemplate(s)}, settings=s)
    ok = make_settings(database_url_secret="corral-db/url").model_copy(
        update={"jobs_get_database_url": True}
    )
    assert client.checks.check_job(new, executors={"argo": argo.WorkflowTemplate(ok)}, settings=ok)


names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,20}", fullmatch=True).filter(
    lambda n: not n.startswith("CORRAL_")
)


@settings(max_examples=30, deadline=None)
@given(
    image=st.from_regex(r"[a-z0-9]+(/[a-z0-9]+)?(:[a-z0-9][a-z0-9.]*)?", fullmatch=True),
    command=st.lists(
        st.text(st.characters(blacklist_characters="\x00"), max_size=20), min_size=1, max_size=4
    ).filter(lambda command: command[0].strip()),
    env=st.dictionaries(names, st.text(max_size=10), max_size=3),
    placement=st.sampled_from([None, "batch", "critical"]),
    requests=st.dictionaries(
        st.sampled_from(["cpu", "memory"]), st.sampled_from(["1", "500m", "2Gi"]), max_size=2
    ),
    deadline=st.floats(min_value=10, max_value=240),
    tenant=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,120}", fullmatch=True),
    payload=st.sampled_from([None, SMALL, LARGE]),
)
def test_every_workflow_corral_makes_passes_the_check(
    image: str,
    command: list[str],
    env: dict[str, str],
    placement: str | None,
    requests: dict[str, str],
    deadline: float,
    tenant: str,
    payload: Any,
) -> None:
    spec: dict[str, Any] = {"image": image, "command": command, "env": env}
    if placement:
        spec["placement"] = placement
    if requests:
        spec["resources"] = {"requests": requests}
    doc = workflow(
        spec, tenant=tenant, policy={"limits": {"attempt_deadline": deadline}}, payload=payload
    )
    argo_manifest.check_workflow(doc)


def _finished(phase: str, node: dict[str, Any], message: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": "corral-1-1", "labels": {}},
        "status": {"phase": phase, "message": message, "nodes": {"n": {"type": "Pod", **node}}},
    }


@pytest.mark.parametrize(
    ("wf", "reason", "verdict", "code"),
    [
        (
            _finished("Failed", {"phase": "Failed", "message": argo_observation.DEADLINE}),
            "deadline exceeded",
            "transient",
            None,
        ),
        (
            _finished("Error", {"phase": "Error", "message": "pod deleted"}),
            "pod deleted",
            "transient",
            None,
        ),
        (
            _finished("Failed", {"phase": "Failed"}, "Stopped with strategy 'Terminate'"),
            "cancelled",
            None,
            None,
        ),
        # Argo's minimal CRDs let in a Workflow its controller then refuses, with no pod.
        (
            {
                "metadata": {"name": "corral-1-1", "labels": {}},
                "status": {
                    "phase": "Failed",
                    "message": "invalid spec: spec.entrypoint template 'main' undefined",
                },
            },
            "Workflow refused by Argo: invalid spec: spec.entrypoint template 'main' undefined",
            "permanent",
            None,
        ),
        # A job that prints the controller's words is still judged by its exit code.
        (
            _finished(
                "Failed",
                {
                    "phase": "Failed",
                    "message": "pod deleted\ndeadline",
                    "outputs": {"exitCode": "3"},
                },
            ),
            "workflow Failed (exit code 3)",
            None,
            3,
        ),
    ],
)
def test_a_finished_workflow_is_judged_by_the_controllers_words_only(
    wf: dict[str, Any], reason: str, verdict: str | None, code: int | None
) -> None:
    obs = argo_observation.workflow_observation(wf)
    assert obs.phase is launching.Phase.FAILED
    assert obs.reason is not None
    assert obs.reason.startswith(reason)
    assert obs.failure_class == (model.FailureClass(verdict) if verdict else None)
    assert obs.exit_code == code


# --- the payload -------------------------------------------------------------------------------


def test_a_small_payload_is_in_the_environment_as_on_a_job() -> None:
    doc = workflow({"image": "busybox", "command": ["true"]}, payload=SMALL)
    [template] = doc["spec"]["templates"]
    env = {e["name"]: e.get("value") for e in template["container"]["env"]}
    assert env["CORRAL_PAYLOAD"] == launching.payload_json(SMALL)
    assert "volumes" not in doc["spec"]
    argo_manifest.check_workflow(doc)


def test_a_large_payload_is_a_workflow_volume_mounted_read_only() -> None:
    spec = {"image": "busybox", "command": ["true"]}
    doc = workflow(spec, payload=LARGE)
    assert doc["spec"]["volumes"] == [
        {"name": "corral-payload", "configMap": {"name": "corral-0-1", "defaultMode": 0o444}}
    ]
    [template] = doc["spec"]["templates"]
    job = kubernetes.dry_run(
        model.NewJob(executor="kubernetes", spec=spec, payload=LARGE), make_settings(), NOW
    )
    assert template["container"] == job["spec"]["template"]["spec"]["containers"][0]
    assert template["container"]["volumeMounts"] == [
        {"name": "corral-payload", "mountPath": "/var/run/corral/payload", "readOnly": True}
    ]
    env = {e["name"]: e.get("value") for e in template["container"]["env"]}
    assert env["CORRAL_PAYLOAD_FILE"] == MOUNTED_FILE
    argo_manifest.check_workflow(doc)


def test_the_attempt_token_is_read_from_the_launchs_secret_as_on_a_job() -> None:
    s = api_settings()
    spec = {"image": "busybox", "command": ["true"]}
    doc = workflow(spec, settings=s)
    assert launching.attempt_token(ATTEMPT_KEY, 0, 0) not in json.dumps(doc), "never in the clear"
    [template] = doc["spec"]["templates"]
    [entry] = [e for e in template["container"]["env"] if e["name"] == "CORRAL_ATTEMPT_TOKEN"]
    assert entry["valueFrom"] == {"secretKeyRef": {"name": "corral-0-1", "key": "token"}}
    job = kubernetes.dry_run(model.NewJob(executor="kubernetes", spec=spec), s, NOW)
    assert template["container"] == job["spec"]["template"]["spec"]["containers"][0]
    argo_manifest.check_workflow(doc)


# --- least privilege and the pod fields ---------------------------------------------------------


def test_every_pod_field_reaches_the_workflow_and_passes_the_argo_schema() -> None:
    from tests.unit.test_kubernetes_jobs import EVERYTHING

    doc = workflow(EVERYTHING, payload=LARGE)
    argo_manifest.check_workflow(doc)
    spec = doc["spec"]
    [template] = spec["templates"]
    container = template["container"]
    assert spec["securityContext"] == {
        "fsGroup": 1000,
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["podMetadata"]["annotations"] == {"example.com/team": "data"}
    assert [v["name"] for v in spec["volumes"]] == ["data", "scratch", "corral-payload"]
    assert template["affinity"] == EVERYTHING["affinity"]
    [proxy] = template["initContainers"]
    assert (proxy["name"], proxy["restartPolicy"]) == ("proxy", "Always")
    assert doc["metadata"]["namespace"] == "jobs"


def test_pod_gc_is_on_pod_completion_unless_the_settings_say_otherwise() -> None:
    plain = {"image": "busybox", "command": ["true"]}
    gc = workflow(plain)["spec"]["podGC"]
    assert gc == {"strategy": "OnPodCompletion", "deleteDelayDuration": "120s"}
    later = make_settings(argo_pod_gc="OnWorkflowSuccess", argo_pod_gc_delay="10m")
    doc = workflow(plain, settings=later)
    assert doc["spec"]["podGC"] == {"strategy": "OnWorkflowSuccess", "deleteDelayDuration": "600s"}
    argo_manifest.check_workflow(doc)
    assert "podGC" not in workflow(plain, settings=make_settings(argo_pod_gc="Never"))["spec"]
    with pytest.raises(ValueError, match="argo_pod_gc"):
        make_settings(argo_pod_gc="Sometimes")


def test_a_workflow_runs_in_an_allowed_namespace_only() -> None:
    s = make_settings(namespaces=["jobs", "etl"])
    doc = workflow({"image": "b", "command": ["x"], "namespace": "etl"}, settings=s)
    assert doc["metadata"]["namespace"] == "etl"
    with pytest.raises(errors.InvalidInput, match="argo spec: namespace: 'etl' is not allowed"):
        workflow({"image": "b", "command": ["x"], "namespace": "etl"})


def test_a_workflow_s_own_containers_mount_no_token_but_argo_s_executor_does() -> None:
    """automountServiceAccountToken: false on the Workflow, and Argo's executor (its init
    and wait containers) given the job's account, whose Role records the step's result."""
    plain = workflow({"image": "busybox:1.36", "command": ["true"]})["spec"]
    assert plain["automountServiceAccountToken"] is False
    assert plain["executor"] == {"serviceAccountName": "default"}
    s = make_settings(
        service_account="runner", allowed_service_accounts=["runner"], token_accounts=["runner"]
    )
    trusted = workflow({"image": "busybox:1.36", "command": ["true"]}, settings=s)["spec"]
    assert trusted["serviceAccountName"] == "runner"
    assert "automountServiceAccountToken" not in trusted
    assert "executor" not in trusted
    etl = make_settings(service_account="etl", allowed_service_accounts=["etl"])
    own = workflow({"image": "busybox:1.36", "command": ["true"]}, settings=etl)["spec"]
    assert own["executor"] == {"serviceAccountName": "etl"}
