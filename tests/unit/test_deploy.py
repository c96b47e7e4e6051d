"""deploy/: the manifests that run corral itself on Kubernetes.

Every document passes the strict schemas of the oldest and newest supported Kubernetes,
`corral lint` finds nothing, the ConfigMap's corral.toml is valid settings whose limits
nest, the Role grants exactly what the executors need, the loops' Deployments have probes
that work and a grace period above their drain, the API's probes /healthz and /readyz over
HTTP, and the Prometheus example scrapes what the Deployments serve.
"""

from __future__ import annotations

import asyncio
import json
import os
import tomllib
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral import cli, clock, config, durations, errors, health, lint, model
from corral.executors import kubernetes, kubernetes_manifest
from corral.testing import assert_timeouts_nest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# Kustomize's own file: not a Kubernetes object, so no published schema knows its kind.
KUSTOMIZATION = DEPLOY / "kustomization.yaml"
CONFIG_PATH = "/etc/corral/corral.toml"
DEPLOYMENTS = {
    "corral-dispatcher": "dispatcher",
    "corral-reconciler": "reconciler",
    "corral-scheduler": "scheduler",
}
METRICS = {"corral-dispatcher": "0.0.0.0:9100", "corral-reconciler": "0.0.0.0:9100"}
"""The loops that serve their own metrics (--metrics), and where."""
SERVICE_MONITOR = DEPLOY / "examples" / "servicemonitor.yaml"
ROLE = {(r.group, r.resource): set(r.verbs) for r in kubernetes.RULES.corral}
"""What the kubernetes executor, the one deploy/config.yaml enables, says it calls."""


def _manifest_files() -> list[Path]:
    return sorted(p for p in DEPLOY.glob("*.yaml") if p != KUSTOMIZATION)


def _docs() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in _manifest_files():
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                yield path, doc


DOCS = list(_docs())


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    [doc] = [d for _, d in DOCS if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def _deployment(name: str) -> dict[str, Any]:
    return _one("Deployment", name)


def _pod(name: str) -> dict[str, Any]:
    pod: dict[str, Any] = _deployment(name)["spec"]["template"]["spec"]
    return pod


def _container(name: str) -> dict[str, Any]:
    [container] = _pod(name)["containers"]
    return container


def _env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.fixture
def toml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ConfigMap's corral.toml as a file, with no CORRAL_* variables around it."""
    for name in [n for n in os.environ if n.startswith("CORRAL_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "corral.toml"
    path.write_text(_one("ConfigMap", "corral-config")["data"]["corral.toml"], encoding="utf-8")
    return path


@pytest.fixture
def settings(toml_file: Path) -> config.Settings:
    return config.Settings.load(toml_file)


# --- schemas and lint -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [d for _, d in DOCS],
    ids=[f"{p.name}:{d['kind']}/{d['metadata']['name']}" for p, d in DOCS],
)
def test_every_manifest_passes_the_strict_schemas_of_both_supported_versions(
    doc: dict[str, Any],
) -> None:
    kubernetes_manifest.check_manifest(doc)  # 1.31 and 1.37, strict, plus names and labels


def test_the_kustomization_applies_every_manifest_and_sets_the_image() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == [p.name for p in _manifest_files()]
    [image] = kustomization["images"]
    every = [*DEPLOYMENTS, "corral-api"]
    images = {c["image"] for name in every for c in _pod(name)["initContainers"]}
    images |= {_container(name)["image"] for name in every}
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text(encoding="utf-8"))
    version = project["project"]["version"]
    assert images == {f"{image['name']}:{version}"}, "the version built, never latest"
    assert str(image["newTag"]) == version
    # The NetworkPolicy names none: it is applied in every namespace jobs run in.
    per_namespace = ("Namespace", "NetworkPolicy")
    namespaces = {d["metadata"].get("namespace") for _, d in DOCS if d["kind"] not in per_namespace}
    assert namespaces == {kustomization["namespace"]} == {_one("Namespace")["metadata"]["name"]}
    assert "namespace" not in _one("NetworkPolicy")["metadata"]


def test_corral_lint_finds_nothing(settings: config.Settings) -> None:
    assert lint.lint_paths([DEPLOY], settings) == []
    assert lint.lint_paths([DEPLOY], config.Settings()) == []


# --- settings --------------------------------------------------------------------------------------


def test_the_configmap_holds_valid_settings_whose_limits_nest(
    settings: config.Settings, toml_file: Path
) -> None:
    assert_timeouts_nest(config_file=toml_file)
    k8s = settings.executors.kubernetes
    assert settings.executors.enabled == ("kubernetes",)
    assert k8s.namespace == _one("Role")["metadata"]["namespace"]
    assert set(k8s.placements) >= {"critical", "batch"}
    assert k8s.placements["batch"].tolerations
    assert str(settings.state_dir).startswith("/tmp/"), "the root filesystem is read-only"


def test_pods_reach_corral_through_its_api_never_with_the_database_url(
    settings: config.Settings,
) -> None:
    service = _one("Service", "corral-api")
    port = service["spec"]["ports"][0]["port"]
    assert settings.api_url == f"http://corral-api.{service['metadata']['namespace']}.svc:{port}"
    assert settings.database_url_for_jobs is None
    assert kubernetes_manifest.database_secret(settings) is None
    new = model.NewJob(executor="kubernetes", spec={"image": "busybox", "command": ["true"]})
    doc = kubernetes.dry_run(new, settings, datetime(2026, 1, 1, tzinfo=UTC))
    [container] = doc["spec"]["template"]["spec"]["containers"]
    assert "CORRAL_DATABASE_URL" not in _env(container)
    assert _env(container)["CORRAL_API_URL"] == settings.api_url
    assert "corral-database" not in json.dumps(doc)


def test_the_example_secret_holds_a_postgresql_url() -> None:
    url = _one("Secret", "corral-database")["stringData"]["url"]
    assert config.Settings(database_url=url).database_url.startswith("postgresql+psycopg://")


# --- rights ----------------------------------------------------------------------------------------


def test_the_role_grants_exactly_what_the_executors_need() -> None:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in _one("Role", "corral")["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames, no URLs"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == ROLE
    assert not [d for _, d in DOCS if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_rbac_yaml_is_what_corral_deploy_rbac_prints(toml_file: Path) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli.main, ["--config", str(toml_file), "deploy", "rbac"])
    assert result.exit_code == 0, result.output
    assert result.output == (DEPLOY / "rbac.yaml").read_text(encoding="utf-8"), (
        "run: corral --config <deploy/config.yaml's corral.toml> deploy rbac > deploy/rbac.yaml"
    )


def test_corral_deploy_rbac_gives_argo_pods_their_role_in_every_allowed_namespace(
    toml_file: Path,
) -> None:
    from click.testing import CliRunner

    toml_file.write_text(
        toml_file.read_text(encoding="utf-8").replace(
            'namespace = "corral" ',
            'namespaces = ["corral", "etl"]\nservice_account = "runner"\nnamespace = "corral" ',
        ),
        encoding="utf-8",
    )
    result = CliRunner().invoke(
        cli.main, ["--config", str(toml_file), "deploy", "rbac", "--executors", "kubernetes,argo"]
    )
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.output))
    for doc in docs:
        kubernetes_manifest.check_manifest(doc)
    where = {(d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in docs}
    assert where == {
        ("ServiceAccount", "corral", "corral"),
        *(
            (kind, name, ns)
            for kind in ("Role", "RoleBinding")
            for name in ("corral", "corral-pods")
            for ns in ("corral", "etl")
        ),
    }
    [pods] = [
        d
        for d in docs
        if d["kind"] == "Role"
        and d["metadata"]["namespace"] == "etl"
        and d["metadata"]["name"] == "corral-pods"
    ]
    assert pods["rules"] == [
        {
            "apiGroups": ["argoproj.io"],
            "resources": ["workflowtaskresults"],
            "verbs": ["create", "patch"],
        }
    ]
    [bound] = [
        d
        for d in docs
        if d["kind"] == "RoleBinding"
        and d["metadata"]["namespace"] == "etl"
        and d["metadata"]["name"] == "corral"
    ]
    assert bound["subjects"] == [
        {"kind": "ServiceAccount", "name": "corral", "namespace": "corral"}
    ]
    [runs] = [
        d
        for d in docs
        if d["kind"] == "RoleBinding"
        and d["metadata"]["namespace"] == "etl"
        and d["metadata"]["name"] == "corral-pods"
    ]
    assert runs["subjects"] == [{"kind": "ServiceAccount", "name": "runner", "namespace": "etl"}]
    workflows = [
        r
        for d in docs
        if d["kind"] == "Role"
        for r in d["rules"]
        if r["resources"] == ["workflows"]
    ]
    assert workflows
    assert all("delete" not in r["verbs"] for r in workflows), "cancel patches, never deletes"


def test_argo_may_list_delete_and_label_pods_and_a_shared_rule_keeps_each_reason(
    toml_file: Path,
) -> None:
    from click.testing import CliRunner

    def rbac(executors: str) -> str:
        args = ["--config", str(toml_file), "deploy", "rbac", "--executors", executors]
        result = CliRunner().invoke(cli.main, args)
        assert result.exit_code == 0, result.output
        return result.output

    [role, *_] = [d for d in yaml.safe_load_all(rbac("argo")) if d["kind"] == "Role"]
    pods = [r for r in role["rules"] if r["resources"] == ["pods"]]
    assert pods == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete", "patch"]}
    ]
    both = " ".join(rbac("kubernetes,argo").split())
    assert "# a Job's pods: why one waits" in both
    assert "; a Workflow's pods: delete one" in both


def test_the_deployments_run_as_the_bound_service_account() -> None:
    binding = _one("RoleBinding", "corral")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "corral",
    }
    [subject] = binding["subjects"]
    account = _one("ServiceAccount")["metadata"]
    assert (subject["kind"], subject["name"]) == ("ServiceAccount", account["name"])
    assert subject["namespace"] == account["namespace"]
    for name in DEPLOYMENTS:
        assert _pod(name)["serviceAccountName"] == account["name"]


# --- the Deployments -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "command"), DEPLOYMENTS.items())
def test_each_deployment_runs_its_loop_after_upgrading_the_schema(name: str, command: str) -> None:
    container = _container(name)
    assert container["args"][:3] == ["--config", CONFIG_PATH, command]
    metrics = ["--metrics", METRICS[name]] if name in METRICS else []
    assert container["args"][3:] == metrics
    _parses(command, container["args"][3:])
    [init] = _pod(name)["initContainers"]
    assert init["args"] == ["--config", CONFIG_PATH, "db", "upgrade"]
    for c in (container, init):
        assert _env(c)["CORRAL_DATABASE_URL"] == {
            "secretKeyRef": {"name": "corral-database", "key": "url"}
        }
    labels = _deployment(name)["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == command
    assert labels["app.kubernetes.io/name"] == "corral"


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_each_deployment_has_a_grace_period_above_its_drain(name: str) -> None:
    deployment = _deployment(name)
    drain = float(deployment["metadata"]["annotations"][lint.DRAIN])
    assert _pod(name)["terminationGracePeriodSeconds"] > drain > 0


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_each_deployment_is_locked_down(name: str) -> None:
    pod = _pod(name)
    assert pod["securityContext"]["runAsNonRoot"] is True
    for c in [*pod["containers"], *pod["initContainers"]]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["resources"]["requests"]
        assert c["resources"]["limits"]["memory"]
    health_file = Path(_env(_container(name))["CORRAL_HEALTH_FILE"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in _container(name)["volumeMounts"]}
    writable = [p for p, v in mounts.items() if "emptyDir" in v and health_file.is_relative_to(p)]
    assert writable, "the health file must be on an emptyDir: the root filesystem is read-only"


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_each_deployment_probes_its_health_file(name: str, settings: config.Settings) -> None:
    container = _container(name)
    probes = {p: container[p]["exec"]["command"] for p in ("startupProbe", "readinessProbe")}
    for command in probes.values():
        assert command[:1] == ["corral"]
        assert command[-2:] == ["health", "--ready"]
    live = container["livenessProbe"]["exec"]["command"]
    assert live[:1] == ["corral"]
    assert live[-3:-1] == ["health", "--max-age"]
    max_age = durations.parse_duration(live[-1])
    slowest = max(settings.timeouts.reconcile_interval, settings.timeouts.dispatch_interval)
    assert max_age >= 3 * slowest, "a loop must be able to miss a round or two"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["timeoutSeconds"] >= 5, "each probe starts Python"


@pytest.mark.parametrize(("name", "loop"), DEPLOYMENTS.items())
def test_the_probe_commands_pass_on_a_fresh_health_file_and_fail_on_none(
    name: str, loop: str, toml_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probes' exact arguments, with the container's environment, against a health file
    written the way the loop writes it."""
    container = _container(name)
    env = _env(container)
    health_file = tmp_path / "health.json"
    monkeypatch.setenv("CORRAL_HEALTH_FILE", str(health_file))
    monkeypatch.setenv("CORRAL_DATABASE_URL", _one("Secret")["stringData"]["url"])
    assert set(env) == {"CORRAL_HEALTH_FILE", "CORRAL_DATABASE_URL"}

    def probe(kind: str) -> None:
        args = [
            str(toml_file) if a == CONFIG_PATH else a for a in container[kind]["exec"]["command"]
        ]
        cli.main.main(args[1:], standalone_mode=False)

    with pytest.raises(errors.Unhealthy, match="no health file"):
        probe("readinessProbe")

    async def one_round() -> None:
        async with health.HealthFile(health_file, clock.SystemClock(), [loop]) as beats:
            beats.record(loop)

    asyncio.run(one_round())
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe(kind)


def _parses(command: str, args: list[str]) -> None:
    """The command takes these arguments (parsed as `corral` would, not run)."""
    import click

    found = cli.main.get_command(click.Context(cli.main), command)
    assert found is not None, command
    found.make_context(command, list(args))


@pytest.mark.parametrize("name", METRICS)
def test_the_loops_that_serve_metrics_name_their_port(name: str) -> None:
    _host, _, port = METRICS[name].rpartition(":")
    [declared] = _container(name)["ports"]
    assert (declared["name"], declared["containerPort"]) == ("metrics", int(port))


# --- the API ---------------------------------------------------------------------------------------


def test_the_api_serves_on_its_port_and_is_locked_down() -> None:
    container = _container("corral-api")
    assert container["args"] == ["--config", CONFIG_PATH, "api", "--http", "0.0.0.0:8080"]
    _parses("api", container["args"][3:])
    [port] = container["ports"]
    assert (port["name"], port["containerPort"]) == ("http", 8080)
    pod = _pod("corral-api")
    assert pod["automountServiceAccountToken"] is False, "it launches nothing"
    assert pod["securityContext"]["runAsNonRoot"] is True
    for c in [*pod["containers"], *pod["initContainers"]]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["resources"]["limits"]["memory"]
    [init] = pod["initContainers"]
    assert init["args"] == ["--config", CONFIG_PATH, "db", "upgrade"]
    service = _one("Service", "corral-api")
    labels = _deployment("corral-api")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def test_the_api_probes_healthz_and_readyz_and_they_answer(tmp_path: Path) -> None:
    """The probes' paths, asked of the app itself over a real store: 200 with no token."""
    import httpx

    from corral import client, store
    from corral.api import create_app

    container = _container("corral-api")
    probes = {
        p: container[p]["httpGet"] for p in ("startupProbe", "readinessProbe", "livenessProbe")
    }
    assert {p: (g["path"], g["port"]) for p, g in probes.items()} == {
        "startupProbe": ("/readyz", "http"),
        "readinessProbe": ("/readyz", "http"),
        "livenessProbe": ("/healthz", "http"),
    }

    async def ask() -> dict[str, int]:
        db = store.Store.connect(f"sqlite:///{tmp_path / 'corral.db'}")
        await db.database.migrate()
        c = client.Client(
            store=db, executors={}, settings=config.Settings(), clock=clock.SystemClock()
        )
        try:
            transport = httpx.ASGITransport(app=create_app(c))
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                return {g["path"]: (await http.get(g["path"])).status_code for g in probes.values()}
        finally:
            await db.close()

    assert asyncio.run(ask()) == {"/readyz": 200, "/healthz": 200}


# --- Prometheus -----------------------------------------------------------------------------------


def test_the_prometheus_example_scrapes_the_api_with_a_token_and_the_loops_ports() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert not [r for r in kustomization["resources"] if "examples" in r], "needs the CRDs"
    docs = {d["kind"]: d for d in yaml.safe_load_all(SERVICE_MONITOR.read_text(encoding="utf-8"))}
    assert {d["apiVersion"] for d in docs.values()} == {"monitoring.coreos.com/v1"}
    monitor = docs["ServiceMonitor"]
    service = _one("Service", "corral-api")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["type"] == "Bearer"
    assert set(endpoint["authorization"]["credentials"]) == {"name", "key"}
    pods = docs["PodMonitor"]
    [endpoint] = pods["spec"]["podMetricsEndpoints"]
    selected = {
        name
        for name in DEPLOYMENTS
        if all(
            _pod_labels(name).get(e["key"]) in e["values"]
            for e in pods["spec"]["selector"]["matchExpressions"]
        )
    }
    assert selected == set(METRICS)
    for name in selected:
        assert endpoint["port"] in {p["name"] for p in _container(name)["ports"]}


def _pod_labels(name: str) -> dict[str, str]:
    labels: dict[str, str] = _deployment(name)["spec"]["template"]["metadata"]["labels"]
    return labels


WORKER = DEPLOY / "examples" / "worker.yaml"


def test_the_worker_example_passes_the_schemas_and_its_grace_covers_its_drain(
    settings: config.Settings,
) -> None:
    doc = yaml.safe_load(WORKER.read_text(encoding="utf-8"))
    kubernetes_manifest.check_manifest(doc)
    assert lint.lint_paths([WORKER], settings) == []
    shorter = settings.model_copy(
        update={
            "timeouts": settings.timeouts.model_copy(
                update={"drain_timeout": timedelta(seconds=60)}
            )
        }
    )
    [found] = lint.lint_paths([WORKER], shorter)  # a longer drain than its grace allows
    assert found.rule == "worker-grace"


def test_the_network_policy_keeps_every_job_pod_from_the_database() -> None:
    policy = _one("NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Egress"]
    settings = config.Settings(executors={"kubernetes": {"namespace": "corral"}})
    new = model.NewJob(
        executor="kubernetes",
        spec=kubernetes.JobTemplate(settings).validate_spec(
            {"image": "busybox:1.36", "command": ["true"]}
        ),
    )
    made = kubernetes.dry_run(new, settings, datetime(2026, 1, 1, tzinfo=UTC))
    pod_labels = made["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    [rule] = policy["spec"]["egress"]
    v4 = next(b["ipBlock"] for b in rule["to"] if b["ipBlock"]["cidr"] == "0.0.0.0/0")
    assert v4["except"]  # the database's address, which the operator fills in
    assert "network-policy.yaml" in KUSTOMIZATION.read_text()
