"""The Jobs the `kubernetes` executor creates: their fields, and that every one of them
passes the published schemas (strict) of the oldest and newest supported Kubernetes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import config, errors, launching, model
from corral.executors import (
    base,
    kubernetes,
    kubernetes_manifest,
    kubernetes_owned,
    kubernetes_spec,
    registry,
)
from corral.testing import FrozenClock

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PLACEMENTS = {
    "critical": {"node_selector": {"pool": "on-demand"}, "priority_class": "high"},
    "batch": {
        "node_selector": {"pool": "spot"},
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def make_settings(**k8s_settings: Any) -> config.Settings:
    return config.Settings(
        executors={"kubernetes": {"placements": PLACEMENTS, "namespace": "jobs", **k8s_settings}}
    )


def job(spec: dict[str, Any], **kw: Any) -> dict[str, Any]:
    s = kw.pop("settings", None) or make_settings()
    template = kubernetes.JobTemplate(s)
    new = model.NewJob(executor="kubernetes", spec=template.validate_spec(spec), **kw)
    return kubernetes.dry_run(new, s, NOW)


def test_a_job_carries_corrals_rules_labels_and_environment() -> None:
    doc = job(
        {"image": "busybox:1.36", "command": ["sh", "-c", "echo hi"], "env": {"MODE": "x"}},
        labels={"team": "data"},
        queue="etl",
        policy={"limits": {"attempt_deadline": 90.5}},
    )
    spec, pod = doc["spec"], doc["spec"]["template"]["spec"]
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) == (
        "batch/v1",
        "Job",
        "corral-0-1",
    )
    assert doc["metadata"]["namespace"] == "jobs"
    assert spec["backoffLimit"] == 0, "corral owns retries"
    assert spec["activeDeadlineSeconds"] == 91, "the job's own deadline, whole seconds up"
    assert spec["ttlSecondsAfterFinished"] == 86400
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] == 30
    labels = doc["metadata"]["labels"]
    assert labels == spec["template"]["metadata"]["labels"], "the pods carry them too"
    assert labels["team"] == "data"
    assert model.identity_from_labels(labels) == model.Identity(0, 1, 0)
    assert labels[model.CAPABILITY] == "etl"
    [container] = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MODE"] == "x"
    assert (env["CORRAL_JOB_ID"], env["CORRAL_ATTEMPT"], env["CORRAL_FENCE"]) == ("0", "1", "0")
    assert "CORRAL_DATABASE_URL" not in env, "never a database URL in the clear"
    kubernetes_manifest.check_manifest(doc)


def test_long_values_are_hashed_in_labels_and_kept_whole_in_annotations() -> None:
    tenant = "acme-" + "x" * 80
    doc = job({"image": "busybox", "command": ["true"]}, tenant=tenant, idempotency_key="a b/c")
    labels, notes = doc["metadata"]["labels"], doc["metadata"]["annotations"]
    assert labels[model.TENANT].startswith("h-")
    assert notes == {model.TENANT: tenant, model.IDEMPOTENCY_KEY: "a b/c"}
    kubernetes_manifest.check_manifest(doc)


def test_placement_classes_and_the_database_secret() -> None:
    s = make_settings(
        database_url_secret="corral-db/url",
        service_account="runner",
        allowed_service_accounts=["runner", "etl"],
    ).model_copy(update={"jobs_get_database_url": True})  # the Secret is honoured only so
    unset = make_settings(database_url_secret="corral-db/url")
    told_not = job({"image": "busybox", "command": ["true"]}, settings=unset)
    [plain] = told_not["spec"]["template"]["spec"]["containers"]
    assert "CORRAL_DATABASE_URL" not in {e["name"] for e in plain.get("env", [])}
    batch = job({"image": "busybox", "command": ["true"], "placement": "batch"}, settings=s)
    pod = batch["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "spot"}
    assert pod["tolerations"] == [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["serviceAccountName"] == "runner"
    [container] = pod["containers"]
    [secret] = [e for e in container["env"] if e["name"] == "CORRAL_DATABASE_URL"]
    assert secret == {
        "name": "CORRAL_DATABASE_URL",
        "valueFrom": {"secretKeyRef": {"name": "corral-db", "key": "url"}},
    }
    critical = job(
        {
            "image": "busybox",
            "command": ["true"],
            "placement": "critical",
            "service_account": "etl",
        },
        settings=s,
    )["spec"]["template"]["spec"]
    assert (critical["priorityClassName"], critical["serviceAccountName"]) == ("high", "etl")
    kubernetes_manifest.check_manifest(batch)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"command": ["true"]}, "image: required"),
        ({"image": "a b", "command": ["true"]}, "'a b' is not an image reference"),
        ({"image": "Bad Image!!", "command": ["true"]}, "'Bad Image!!' is not an image reference"),
        ({"image": "busybox", "command": ["", "x"]}, "the program to run, is empty"),
        ({"image": "busybox"}, "command: required"),
        ({"image": "busybox", "command": []}, "command: required"),
        (
            {"image": "busybox", "command": ["true"], "placement": "gpu"},
            "unknown placement class 'gpu' (batch, critical)",
        ),
        ({"image": "busybox", "command": ["true"], "env": {"1X": "a"}}, "not a valid environment"),
        ({"image": "busybox", "command": ["true"], "env": {"CORRAL_FENCE": "9"}}, "set by corral"),
        (
            {"image": "busybox", "command": ["true"], "env": {"A": 1}},
            "A: the value must be a string",
        ),
        (
            {"image": "busybox", "command": ["true"], "resources": {"requests": {"cpu": "lots"}}},
            "resources.requests.cpu: 'lots' is not a quantity",
        ),
        (
            {"image": "busybox", "command": ["true"], "resources": {"wants": {}}},
            "requests` and/or `limits",
        ),
        ({"image": "busybox", "command": ["true"], "service_account": "Bad_Name"}, "DNS-1123"),
        ({"image": "busybox", "command": ["true"], "replicas": 2}, "replicas: unknown field"),
        (
            {"image": "busybox", "command": ["true"], "placement": ["batch"]},
            "unknown placement class",
        ),
        ({"image": "busybox", "command": ["true"], "env": {"..": "x"}}, "not a valid environment"),
        (
            {
                "image": "b",
                "command": ["x"],
                "resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}},
            },
            "resources.requests.memory: 2Gi is more than its limit 1Gi",
        ),
        (
            {"image": "b", "command": ["x"], "resources": {"limits": {"nvidia.com/gpu": "500m"}}},
            "an extended resource is whole units",
        ),
        (
            {
                "image": "b",
                "command": ["x"],
                "resources": {
                    "requests": {"nvidia.com/gpu": "1"},
                    "limits": {"nvidia.com/gpu": "2"},
                },
            },
            "request must equal its limit",
        ),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidInput) as caught:
        kubernetes.JobTemplate(make_settings()).validate_spec(spec)
    assert str(caught.value).startswith("kubernetes spec: ")
    assert message in str(caught.value)


def good_doc() -> dict[str, Any]:
    return job({"image": "busybox", "command": ["true"]})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["spec"].update(backofLimit=1), "Additional properties are not allowed"),
        (lambda d: d["spec"].update(backoffLimit="zero"), "spec.backoffLimit"),
        (lambda d: d["metadata"].update(name="Corral-1-1"), "must be a DNS-1123 label"),
        (lambda d: d["metadata"].update(name="corral-" + "1" * 60), "at most 63 characters"),
        (lambda d: d["metadata"]["labels"].update(team="has space"), "label team='has space'"),
    ],
)
def test_the_manifest_check_catches_what_the_api_server_would_refuse(
    change: Any, message: str
) -> None:
    doc = good_doc()
    change(doc)
    with pytest.raises(errors.InvalidInput, match=message):
        kubernetes_manifest.check_manifest(doc)


names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,20}", fullmatch=True).filter(
    lambda n: not n.startswith("CORRAL_")
)
quantities = st.sampled_from(["1", "500m", "0.5", "2Gi", "512Mi", "1e3", "100k"])


@settings(max_examples=40, deadline=None)
@given(
    image=st.from_regex(r"[a-z0-9]+(/[a-z0-9]+)?(:[a-z0-9][a-z0-9.]*)?", fullmatch=True),
    command=st.lists(
        st.text(st.characters(blacklist_characters="\x00"), max_size=20), min_size=1, max_size=4
    ).filter(lambda command: command[0].strip()),
    env=st.dictionaries(names, st.text(max_size=10), max_size=3),
    placement=st.sampled_from([None, "batch", "critical"]),
    requests=st.dictionaries(st.sampled_from(["cpu", "memory"]), quantities, max_size=2),
    gpus=st.sampled_from([None, "1", "2"]),
    deadline=st.floats(min_value=10, max_value=240),
    tenant=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,120}", fullmatch=True),
    payload=st.sampled_from([None, "small", "large"]),
)
def test_every_job_corral_makes_passes_the_strict_schemas(
    image: str,
    command: list[str],
    env: dict[str, str],
    placement: str | None,
    requests: dict[str, str],
    gpus: str | None,
    deadline: float,
    tenant: str,
    payload: str | None,
) -> None:
    spec: dict[str, Any] = {"image": image, "command": command, "env": env}
    if gpus:
        requests = {**requests, "nvidia.com/gpu": gpus}
    if placement:
        spec["placement"] = placement
    if requests:
        spec["resources"] = {"requests": requests}
    doc = job(
        spec,
        tenant=tenant,
        policy={"limits": {"attempt_deadline": deadline}},
        payload=PAYLOADS.get(payload),
    )
    kubernetes_manifest.check_manifest(doc)


def test_a_ttl_shorter_than_recovery_grace_is_refused() -> None:
    with pytest.raises(errors.ConfigError, match="executors.kubernetes.ttl_after_finished"):
        config.Settings.load(None, executors={"kubernetes": {"ttl_after_finished": "5m"}})
    with pytest.raises(errors.ConfigError, match="default_placement 'gpu' is not one"):
        config.Settings.load(None, executors={"kubernetes": {"default_placement": "gpu"}})
    with pytest.raises(errors.ConfigError, match="not a DNS-1123 label"):
        config.Settings.load(None, executors={"kubernetes": {"namespace": "Jobs"}})


def test_huge_pages_are_a_resource_and_kubernetes_own_label_keys_are_refused() -> None:
    spec = {
        "image": "busybox",
        "command": ["true"],
        "resources": {"limits": {"hugepages-2Mi": "1Gi"}},
    }
    kubernetes_manifest.check_manifest(job(spec))
    for key in ("job-name", "batch.kubernetes.io/job-name", "kubernetes.io/arch"):
        with pytest.raises(errors.InvalidInput, match="Kubernetes sets it"):
            model.check_label(key, "x")


def test_a_placement_removed_from_the_settings_is_a_clear_launch_error() -> None:
    template = kubernetes.JobTemplate(make_settings())
    spec = template.validate_spec({"image": "busybox", "command": ["true"], "placement": "batch"})
    with pytest.raises(errors.ExecutorError, match="'batch' is no longer in the settings"):
        kubernetes.JobTemplate(config.Settings()).manifest(
            kubernetes_manifest.placeholder_launch(spec), spec
        )


def test_quantities_read_as_kubernetes_reads_them() -> None:
    from decimal import Decimal

    assert kubernetes_spec.quantity("500m") == Decimal("0.5")
    assert kubernetes_spec.quantity("1Gi") == 2**30
    assert kubernetes_spec.quantity("1.5M") == 1_500_000
    assert kubernetes_spec.quantity("1e3") == 1000
    assert kubernetes_spec.quantity("512Mi") < kubernetes_spec.quantity("1G")


@pytest.mark.parametrize(
    ("placements", "message"),
    [
        ({"x": {"node_selector": {"pool": "has space"}}}, "node_selector: label pool='has space'"),
        ({"x": {"tolerations": [{"operator": "Equal", "value": "a"}]}}, "without a key must use"),
        (
            {"x": {"tolerations": [{"key": "bad key", "operator": "Exists"}]}},
            "toleration: label key",
        ),
        ({"x": {"priority_class": "High"}}, "not a DNS-1123 subdomain"),
    ],
)
def test_placement_classes_are_checked_when_settings_load(
    placements: dict[str, Any], message: str
) -> None:
    with pytest.raises(errors.ConfigError, match=message):
        config.Settings.load(None, executors={"kubernetes": {"placements": placements}})


def test_a_heartbeat_job_must_be_able_to_reach_corral() -> None:
    from corral import client

    new = model.NewJob(
        executor="kubernetes",
        spec={"image": "busybox", "command": ["true"]},
        policy={"heartbeat": True},
    )
    s = make_settings()
    with pytest.raises(errors.InvalidInput, match="cannot reach corral to send heartbeats"):
        client.checks.check_job(
            new, executors={"kubernetes": kubernetes.JobTemplate(s)}, settings=s
        )
    ok = make_settings(database_url_secret="corral-db/url").model_copy(
        update={"jobs_get_database_url": True}
    )
    assert client.checks.check_job(
        new, executors={"kubernetes": kubernetes.JobTemplate(ok)}, settings=ok
    )


@pytest.mark.parametrize("kind", ["kubernetes", "argo"])
def test_a_job_may_run_only_as_an_allowed_service_account(kind: str) -> None:
    template = registry.checker(kind, make_settings(service_account="runner"), FrozenClock())
    ok = {"image": "busybox", "command": ["true"]}
    assert template.validate_spec({**ok, "service_account": "runner"})["service_account"] == (
        "runner"
    )
    with pytest.raises(errors.InvalidInput, match="allowed_service_accounts") as refused:
        template.validate_spec({**ok, "service_account": "corral"})  # corral's own: creates Jobs
    assert f"{kind} spec: service_account: 'corral' is not allowed" in str(refused.value)
    nobody = registry.checker(kind, make_settings(), FrozenClock())
    with pytest.raises(errors.InvalidInput, match=r"allowed_service_accounts \(none"):
        nobody.validate_spec({**ok, "service_account": "runner"})
    listed = make_settings(allowed_service_accounts=["etl", "loader"])
    assert registry.checker(kind, listed, FrozenClock()).validate_spec(
        {**ok, "service_account": "loader"}
    )


def test_the_default_service_account_must_be_allowed() -> None:
    with pytest.raises(ValueError, match="must be one of allowed_service_accounts"):
        make_settings(service_account="runner", allowed_service_accounts=["etl"])


# --- the payload -------------------------------------------------------------------------------

SMALL = {"text": "grüße, 世界, 🐎", "n": [1, 2.5, True, None]}
LARGE = {"rows": ["é" * 100] * 200}  # 40 KB of UTF-8, 20 K characters: past 32 KiB
PAYLOADS = {"small": SMALL, "large": LARGE}
MOUNTED_FILE = "/var/run/corral/payload/payload.json"


def env_of(doc: dict[str, Any]) -> dict[str, str | None]:
    [container] = doc["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_a_small_payload_is_its_json_in_the_environment() -> None:
    doc = job({"image": "busybox", "command": ["true"]}, payload=SMALL)
    env = env_of(doc)
    assert env["CORRAL_PAYLOAD"] == launching.payload_json(SMALL)
    assert "CORRAL_PAYLOAD_FILE" not in env
    assert "volumes" not in doc["spec"]["template"]["spec"]
    kubernetes_manifest.check_manifest(doc)


def test_a_null_payload_is_neither_variable() -> None:
    env = env_of(job({"image": "busybox", "command": ["true"]}))
    assert "CORRAL_PAYLOAD" not in env
    assert "CORRAL_PAYLOAD_FILE" not in env


@pytest.mark.parametrize(("chars", "mounted"), [(16383, False), (16384, True)])
def test_the_environment_holds_up_to_32_kib_of_utf8(chars: int, mounted: bool) -> None:
    payload = "é" * chars  # two bytes each, plus the two quotes: 32768 and 32770 bytes
    size = len(json.dumps(payload, ensure_ascii=False).encode())
    assert (size > 32768, chars < 32768) == (mounted, True), "bytes count, not characters"
    env = env_of(job({"image": "busybox", "command": ["true"]}, payload=payload))
    assert ("CORRAL_PAYLOAD_FILE" in env, "CORRAL_PAYLOAD" in env) == (mounted, not mounted)


def test_a_large_payload_is_a_config_map_mounted_read_only() -> None:
    doc = job({"image": "busybox", "command": ["true"]}, payload=LARGE)
    pod = doc["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "corral-payload", "configMap": {"name": "corral-0-1", "defaultMode": 0o444}}
    ], "not optional: the pod waits for it"
    [container] = pod["containers"]
    assert container["volumeMounts"] == [
        {"name": "corral-payload", "mountPath": "/var/run/corral/payload", "readOnly": True}
    ]
    env = env_of(doc)
    assert env["CORRAL_PAYLOAD_FILE"] == MOUNTED_FILE
    assert "CORRAL_PAYLOAD" not in env
    kubernetes_manifest.check_manifest(doc)


def test_the_payload_config_map_is_owned_by_the_job_and_passes_the_schemas() -> None:
    new = model.NewJob(executor="kubernetes", spec={}, payload=LARGE, labels={"team": "data"})
    s = make_settings()
    launch = base.launch_for(model.first_claim(new, NOW), s, NOW)
    job_doc = kubernetes.JobTemplate(s).manifest(launch, {"image": "busybox", "command": ["true"]})
    created = {**job_doc, "metadata": {**job_doc["metadata"], "uid": "3f2b-uid"}}
    owner = kubernetes_owned.owner_reference("batch/v1", "Job", created)
    doc = kubernetes_owned.payload_config_map(
        launch, kubernetes_owned.Payload.of(launch), namespace="jobs", owner=owner
    )
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) == (
        "v1",
        "ConfigMap",
        launch.name,
    )
    assert doc["metadata"]["namespace"] == "jobs"
    assert doc["metadata"]["labels"] == job_doc["metadata"]["labels"], "the Job's labels"
    assert doc["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": launch.name,
            "uid": "3f2b-uid",
            "controller": False,
            "blockOwnerDeletion": True,
        }
    ]
    assert doc["immutable"] is True
    assert doc["data"] == {"payload.json": launching.payload_json(LARGE)}
    kubernetes_manifest.check_manifest(doc)


def test_a_config_map_over_1_mib_is_refused_as_the_api_server_would() -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "big-1"},
        "data": {"payload.json": "x" * (1024 * 1024 + 1)},
    }
    with pytest.raises(errors.InvalidInput, match="ConfigMap data: 1048577 bytes"):
        kubernetes_manifest.check_manifest(doc)


def test_a_payload_no_config_map_holds_is_refused_before_anything_is_made() -> None:
    launch = launching.build_launch(
        model.first_claim(model.NewJob(executor="kubernetes", spec={}, payload="x" * 2**20), NOW),
        reach=launching.Reach(),
        deadline_seconds=None,
    )
    with pytest.raises(errors.LaunchRefused, match="more than a ConfigMap holds"):
        kubernetes_owned.Payload.of(launch).check_size("creating Job jobs/corral-0-1")


# --- the attempt token ------------------------------------------------------------------------

API_URL = "http://corral-api.corral:8080"
ATTEMPT_KEY = "k" * 48


def api_settings() -> config.Settings:
    """Settings under which attempts reach corral through its API, with a token (and a
    database URL Secret too, which the token replaces)."""
    return config.Settings(
        api_url=API_URL,
        attempt_key=ATTEMPT_KEY,
        executors={
            "kubernetes": {
                "placements": PLACEMENTS,
                "namespace": "jobs",
                "database_url_secret": "corral-db/url",
            }
        },
    )


def test_the_attempt_token_is_read_from_the_launchs_secret_never_in_the_clear() -> None:
    doc = job({"image": "busybox", "command": ["true"]}, settings=api_settings())
    token = launching.attempt_token(ATTEMPT_KEY, 0, 0)
    assert token not in json.dumps(doc), "whoever may read Jobs must not read the token"
    [container] = doc["spec"]["template"]["spec"]["containers"]
    [entry] = [e for e in container["env"] if e["name"] == "CORRAL_ATTEMPT_TOKEN"]
    assert entry == {
        "name": "CORRAL_ATTEMPT_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "corral-0-1", "key": "token"}},
    }, "not optional: the pod waits for the Secret"
    assert env_of(doc)["CORRAL_API_URL"] == API_URL
    assert "CORRAL_DATABASE_URL" not in [e["name"] for e in container["env"]]
    kubernetes_manifest.check_manifest(doc)


def test_the_token_secret_is_owned_by_the_job_and_passes_the_schemas() -> None:
    s = api_settings()
    new = model.NewJob(executor="kubernetes", spec={}, labels={"team": "data"}, tenant="t" * 70)
    launch = base.launch_for(model.first_claim(new, NOW), s, NOW)
    job_doc = kubernetes.JobTemplate(s).manifest(launch, {"image": "busybox", "command": ["true"]})
    created = {**job_doc, "metadata": {**job_doc["metadata"], "uid": "3f2b-uid"}}
    owner = kubernetes_owned.owner_reference("batch/v1", "Job", created)
    doc = kubernetes_owned.attempt_secret(launch, namespace="jobs", owner=owner)
    assert doc is not None
    assert (doc["apiVersion"], doc["kind"], doc["type"]) == ("v1", "Secret", "Opaque")
    meta = doc["metadata"]
    assert (meta["name"], meta["namespace"]) == (launch.name, "jobs")
    assert meta["labels"] == job_doc["metadata"]["labels"], "the Job's labels"
    assert meta["annotations"] == job_doc["metadata"]["annotations"], "and its annotations"
    assert meta["ownerReferences"] == [owner]
    assert doc["immutable"] is True
    assert doc["stringData"] == {"token": launching.attempt_token(ATTEMPT_KEY, 0, 0)}
    assert kubernetes_owned.owned_objects(
        launch, kubernetes_owned.Payload.of(launch), namespace="jobs", owner=owner
    ) == [doc]
    kubernetes_manifest.check_manifest(doc)


def test_without_an_api_url_there_is_no_token_and_no_secret() -> None:
    s = make_settings()
    launch = base.launch_for(
        model.first_claim(model.NewJob(executor="kubernetes", spec={}), NOW), s, NOW
    )
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": launch.name, "uid": "u"}
    assert kubernetes_owned.attempt_secret(launch, namespace="jobs", owner=owner) is None
    env = env_of(job({"image": "busybox", "command": ["true"]}, settings=s))
    assert "CORRAL_ATTEMPT_TOKEN" not in env


# --- least privilege and the pod fields ---------------------------------------------------------

EVERYTHING: dict[str, Any] = {
    "image": "ghcr.io/acme/etl:1.4",
    "command": ["python", "-m", "etl"],
    "env": {
        "MODE": "full",
        "PASSWORD": {"secret": "etl-db", "key": "password"},
        "REGION": {"config_map": "etl", "key": "region", "optional": True},
    },
    "env_from": [{"config_map": "etl-settings"}, {"secret": "etl-keys", "prefix": "K_"}],
    "volumes": [
        {"name": "data", "persistentVolumeClaim": {"claimName": "etl-data"}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
    ],
    "volume_mounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
    "image_pull_secrets": ["registry"],
    "pod_security_context": {"runAsUser": 1000, "fsGroup": 1000},
    "security_context": {"readOnlyRootFilesystem": True},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "annotations": {"example.com/team": "data"},
    "sidecars": [
        {
            "name": "proxy",
            "image": "envoyproxy/envoy:v1.31",
            "command": ["envoy"],
            "args": ["-c", "/etc/envoy.yaml"],
            "env": {"TOKEN": {"secret": "proxy", "key": "token"}},
            "volume_mounts": [{"name": "scratch", "mountPath": "/tmp"}],
            "resources": {"requests": {"cpu": "50m"}},
        }
    ],
}


def pod_of(doc: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = doc["spec"]["template"]["spec"]
    return pod


def restricted_problems(pod: dict[str, Any]) -> list[str]:
    """What the Pod Security Standard "restricted" (v1.31) finds wrong with a pod spec."""
    problems = []
    pod_context = pod.get("securityContext", {})
    for c in [*pod["containers"], *pod.get("initContainers", [])]:
        context = c.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{c['name']}: allowPrivilegeEscalation")
        if "ALL" not in context.get("capabilities", {}).get("drop", []):
            problems.append(f"{c['name']}: drop ALL")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            problems.append(f"{c['name']}: runAsNonRoot")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{c['name']}: seccomp")
        if not c.get("resources", {}).get("requests"):
            problems.append(f"{c['name']}: no requests (BestEffort)")
    for volume in pod.get("volumes", []):
        if not set(volume) - {"name"} <= {
            "configMap",
            "secret",
            "emptyDir",
            "persistentVolumeClaim",
        }:
            problems.append(f"volume {volume['name']}")
    return problems


def test_every_pod_is_restricted_and_has_resources_by_default() -> None:
    pod = pod_of(job({"image": "busybox", "command": ["true"]}, payload=LARGE))
    assert restricted_problems(pod) == []
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsUser": 65532,  # by number: an image that declares root (busybox) still starts
    }
    assert pod["automountServiceAccountToken"] is False, "a job needs no API token"
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }


def test_every_pod_field_lands_where_kubernetes_reads_it_and_passes_the_schemas() -> None:
    doc = job(EVERYTHING)
    kubernetes_manifest.check_manifest(doc)
    pod = pod_of(doc)
    assert restricted_problems(pod) == []
    assert doc["spec"]["template"]["metadata"]["annotations"] == {"example.com/team": "data"}
    assert "example.com/team" not in doc["metadata"].get("annotations", {}), "the pod's only"
    [main] = pod["containers"]
    env = {e["name"]: e for e in main["env"]}
    assert env["PASSWORD"] == {
        "name": "PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "etl-db", "key": "password"}},
    }
    assert env["REGION"]["valueFrom"] == {
        "configMapKeyRef": {"name": "etl", "key": "region", "optional": True}
    }
    assert main["envFrom"] == [
        {"configMapRef": {"name": "etl-settings"}},
        {"secretRef": {"name": "etl-keys"}, "prefix": "K_"},
    ]
    assert main["volumeMounts"] == [{"name": "data", "mountPath": "/data", "readOnly": True}]
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["runAsNonRoot"] is True, "the defaults stay under the job's"
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["affinity"] == EVERYTHING["affinity"]
    assert [v["name"] for v in pod["volumes"]] == ["data", "scratch"]
    [proxy] = pod["initContainers"]
    assert proxy["restartPolicy"] == "Always", "a native sidecar: it never holds the pod"
    assert proxy["resources"] == {
        "requests": {"cpu": "50m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert proxy["env"] == [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "proxy", "key": "token"}}}
    ]


def test_a_large_payload_mounts_beside_the_jobs_own_volumes() -> None:
    pod = pod_of(job(EVERYTHING, payload=LARGE))
    assert [v["name"] for v in pod["volumes"]] == ["data", "scratch", "corral-payload"]
    assert [m["name"] for m in pod["containers"][0]["volumeMounts"]] == ["data", "corral-payload"]


def test_resources_and_contexts_layer_defaults_class_then_job() -> None:
    s = make_settings(
        default_resources={
            "requests": {"cpu": "200m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        placements={
            "big": {
                "resources": {"requests": {"memory": "4Gi"}, "limits": {"memory": "8Gi"}},
                "pod_security_context": {"runAsUser": 2000},
                "security_context": {"readOnlyRootFilesystem": True},
            }
        },
    )
    spec = {
        "image": "b",
        "command": ["x"],
        "placement": "big",
        "resources": {"requests": {"cpu": "2"}},
    }
    pod = pod_of(job(spec, settings=s))
    [main] = pod["containers"]
    assert main["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"memory": "8Gi"},
    }, "a layer that names a resource replaces its request and limit below"
    assert pod["securityContext"]["runAsUser"] == 2000
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert restricted_problems(pod) == []
    more = job({**spec, "resources": {"requests": {"memory": "16Gi"}}}, settings=s)
    assert pod_of(more)["containers"][0]["resources"]["requests"]["memory"] == "16Gi"
    assert "memory" not in pod_of(more)["containers"][0]["resources"].get("limits", {})


def test_baseline_lets_a_job_run_as_root_but_never_privileged() -> None:
    s = make_settings(pod_security="baseline")
    spec = {
        "image": "b",
        "command": ["x"],
        "pod_security_context": {"runAsNonRoot": False, "runAsUser": 0},
        "security_context": {"capabilities": {"add": ["CHOWN"], "drop": ["ALL"]}},
    }
    kubernetes_manifest.check_manifest(job(spec, settings=s))
    with pytest.raises(errors.InvalidInput, match="runAsNonRoot: must stay true"):
        job(spec)
    with pytest.raises(errors.InvalidInput, match="SYS_ADMIN may not be added"):
        job({**spec, "security_context": {"capabilities": {"add": ["SYS_ADMIN"]}}}, settings=s)
    hostpath = {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    with pytest.raises(errors.InvalidInput, match="hostPath volumes are not allowed"):
        job({**spec, **hostpath}, settings=s)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]},
            "volumes[0]: hostPath volumes are not allowed under Pod Security 'restricted' (executors.kubernetes.pod_security)",
        ),
        (
            {"volumes": [{"name": "d", "persistentVolumeClaim": {}}]},
            "volumes[0].persistentVolumeClaim: 'claimName' is a required property (Kubernetes 1.31 schema)",
        ),
        ({"volumes": [{"name": "corral-x", "emptyDir": {}}]}, "volumes[0].name: 'corral-x'"),
        (
            {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]},
            "volumes[1].name: 'a': a unique",
        ),
        (
            {"volume_mounts": [{"name": "x", "mountPath": "/x"}]},
            "volume_mounts[0].name: 'x' is not one of the spec's volumes",
        ),
        (
            {
                "volumes": [{"name": "p", "emptyDir": {}}],
                "volume_mounts": [{"name": "p", "mountPath": "/var/run/corral/x"}],
            },
            "volume_mounts[0].mountPath: /var/run/corral is corral's",
        ),
        (
            {"volume_mounts": [{"name": "x"}]},
            "volume_mounts[0]: 'mountPath' is a required property",
        ),
        ({"env": {"A": {"secret": "db"}}}, "env.A.key: required"),
        (
            {"env": {"A": {"secret": "db", "key": "k", "config_map": "c"}}},
            "env.A: must be a string or",
        ),
        ({"env": {"A": {"field": "x"}}}, "env.A: must be a string or"),
        (
            {"env_from": [{"secret": "Bad_Name"}]},
            "env_from[0].secret: 'Bad_Name' is not an object name",
        ),
        (
            {"env_from": [{"config_map": "c", "prefix": "CORRAL_"}]},
            "env_from[0].prefix: names starting CORRAL_",
        ),
        ({"env_from": {"secret": "s"}}, "env_from: must be a list"),
        ({"image_pull_secrets": ["Nope!"]}, "image_pull_secrets[0]: 'Nope!' is not an object name"),
        (
            {"pod_security_context": {"runAsUser": 0}},
            "pod_security_context.runAsUser: 0 (root) is not allowed under Pod Security 'restricted'",
        ),
        (
            {"pod_security_context": {"runAsNonRoot": False}},
            "pod_security_context.runAsNonRoot: must stay true",
        ),
        ({"pod_security_context": {"sysctls": []}}, "pod_security_context.sysctls: may not be set"),
        ({"security_context": {"privileged": True}}, "security_context.privileged: may not be set"),
        (
            {"security_context": {"allowPrivilegeEscalation": True}},
            "security_context.allowPrivilegeEscalation: must stay false",
        ),
        (
            {"security_context": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}},
            "security_context.capabilities.drop: must include ALL",
        ),
        (
            {"security_context": {"seccompProfile": {"type": "Unconfined"}}},
            "security_context.seccompProfile.type: Unconfined is not allowed",
        ),
        (
            {"security_context": {"readOnlyRootFilesystem": "yes"}},
            "security_context.readOnlyRootFilesystem: 'yes' is not of type",
        ),
        (
            {"affinity": {"nodeAfinity": {}}},
            "affinity: Additional properties are not allowed ('nodeAfinity' was unexpected)",
        ),
        (
            {"annotations": {"corral.dev/x": "1"}},
            "annotations.corral.dev/x: the prefix 'corral.dev/' is corral's",
        ),
        ({"annotations": {"bad key": "1"}}, "annotations: key 'bad key'"),
        ({"annotations": {"a": 1}}, "annotations.a: the value must be a string"),
        (
            {"sidecars": [{"name": "main", "image": "x", "command": ["x"]}]},
            "sidecars[0].name: 'main': a unique DNS-1123 label",
        ),
        ({"sidecars": [{"name": "p", "image": "x"}]}, "sidecars[0].command: required"),
        (
            {"sidecars": [{"name": "p", "image": "Bad!", "command": ["x"]}]},
            "sidecars[0].image: 'Bad!' is not an image reference",
        ),
        (
            {"sidecars": [{"name": "p", "image": "x", "command": ["x"], "ports": []}]},
            "sidecars[0].ports: unknown field",
        ),
        (
            {
                "sidecars": [
                    {
                        "name": "p",
                        "image": "x",
                        "command": ["x"],
                        "resources": {"requests": {"cpu": "x"}},
                    }
                ]
            },
            "sidecars[0].resources.requests.cpu: 'x' is not a quantity",
        ),
        (
            {
                "sidecars": [
                    {
                        "name": "p",
                        "image": "x",
                        "command": ["x"],
                        "security_context": {"runAsUser": 0},
                    }
                ]
            },
            "sidecars[0].security_context.runAsUser: 0 (root)",
        ),
        (
            {"namespace": "other"},
            "namespace: 'other' is not allowed: a job may only run in one of executors.kubernetes.namespaces (jobs;",
        ),
    ],
)
def test_a_bad_pod_field_is_refused_naming_the_field_and_the_rule(
    extra: dict[str, Any], message: str
) -> None:
    for kind, template in (
        ("kubernetes", kubernetes.JobTemplate),
        ("argo", argo_template()),
    ):
        with pytest.raises(errors.InvalidInput) as caught:
            template(make_settings()).validate_spec(
                {"image": "busybox", "command": ["true"], **extra}
            )
        assert f"{kind} spec: {message}" in str(caught.value)


def argo_template() -> Any:
    from corral.executors import argo

    return argo.WorkflowTemplate


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        (
            {"pod_security_context": {"runAsUser": 0}},
            "placements.x.pod_security_context.runAsUser: 0 (root)",
        ),
        (
            {"security_context": {"privileged": True}},
            "placements.x.security_context.privileged: may not be set",
        ),
        (
            {"resources": {"requests": {"cpu": "lots"}}},
            "placements.x.resources.requests.cpu: 'lots'",
        ),
    ],
)
def test_a_placement_class_is_held_to_the_same_rules(
    placement: dict[str, Any], message: str
) -> None:
    s = make_settings(placements={"x": placement})
    with pytest.raises(
        errors.ConfigError,
        match=f"executors.kubernetes.{message}".replace("(", "\\(").replace(")", "\\)"),
    ):
        kubernetes.JobTemplate(s)


def test_a_job_runs_in_an_allowed_namespace_only() -> None:
    s = make_settings(namespaces=["jobs", "etl"])
    doc = job({"image": "b", "command": ["x"], "namespace": "etl"}, settings=s)
    assert doc["metadata"]["namespace"] == "etl"
    assert job({"image": "b", "command": ["x"]}, settings=s)["metadata"]["namespace"] == "jobs"
    with pytest.raises(ValueError, match="namespaces must include namespace 'jobs'"):
        make_settings(namespaces=["etl"])
    with pytest.raises(ValueError, match="not a DNS-1123 label"):
        make_settings(namespaces=["jobs", "Etl"])


def test_corrals_own_service_account_can_never_run_a_job() -> None:
    for wrong in ({"service_account": "corral"}, {"allowed_service_accounts": ["etl", "corral"]}):
        with pytest.raises(
            ValueError, match="corral's own account 'corral' \\(own_service_account\\)"
        ):
            make_settings(**wrong)
    with pytest.raises(ValueError, match="own account 'corral-sa'"):
        make_settings(own_service_account="corral-sa", allowed_service_accounts=["corral-sa"])


@pytest.mark.parametrize(
    ("top", "has_url"),
    [
        # database_url_secret set and jobs_get_database_url on: on purpose
        ({"jobs_get_database_url": True}, True),
        ({}, False),  # jobs_get_database_url off, the default
        ({"api_url": "http://corral-api:8080", "attempt_key": ATTEMPT_KEY}, False),
    ],
)
def test_pods_get_the_database_url_only_when_the_settings_hand_it_on_purpose(
    top: dict[str, Any], has_url: bool
) -> None:
    s = config.Settings(
        executors={"kubernetes": {"namespace": "jobs", "database_url_secret": "corral-db/url"}},
        **top,
    )
    env = {
        e["name"]
        for e in pod_of(job({"image": "b", "command": ["x"]}, settings=s))["containers"][0]["env"]
    }
    assert ("CORRAL_DATABASE_URL" in env) is has_url


def test_a_pod_s_own_uid_and_a_token_account_s_token_are_kept() -> None:
    own = pod_of(
        job({"image": "busybox", "command": ["true"], "pod_security_context": {"runAsUser": 1000}})
    )
    assert own["securityContext"]["runAsUser"] == 1000
    settings = make_settings(service_account="runner", token_accounts=["runner"], run_as_user=4242)
    pod = pod_of(job({"image": "busybox", "command": ["true"]}, settings=settings))
    assert pod["automountServiceAccountToken"] is True
    assert pod["securityContext"]["runAsUser"] == 4242
