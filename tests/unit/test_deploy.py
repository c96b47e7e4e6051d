"""deploy/: the manifests that run corral itself on Kubernetes.

Every document passes the strict schemas of the oldest and newest supported Kubernetes,
`corral lint` finds nothing, the ConfigMap's corral.toml is valid settings whose limits
nest, the Role grants exactly what the executors need, and both Deployments have probes
that work and a grace period above their drain.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral import cli, clock, config, errors, health, lint
from corral.executors import kubernetes
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
ROLE = {
    ("batch", "jobs"): {"create", "get", "list", "watch", "delete"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "pods/log"): {"get"},
    ("argoproj.io", "workflows"): {"create", "get", "list", "watch", "delete", "patch"},
    ("", "configmaps"): {"create", "get", "patch"},  # payloads over 32 KiB
    ("", "secrets"): {"create", "get", "patch"},  # attempt tokens, with api_url
    ("batch", "jobs/finalizers"): {"update"},  # blockOwnerDeletion on their owner
    ("argoproj.io", "workflows/finalizers"): {"update"},
}


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
    kubernetes.check_manifest(doc)  # 1.31 and 1.37, strict, plus names and labels


def test_the_kustomization_applies_every_manifest_and_sets_the_image() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == [p.name for p in _manifest_files()]
    [image] = kustomization["images"]
    images = {c["image"] for name in DEPLOYMENTS for c in _pod(name)["initContainers"]}
    images |= {_container(name)["image"] for name in DEPLOYMENTS}
    assert images == {f"{image['name']}:latest"}
    namespaces = {d["metadata"].get("namespace") for _, d in DOCS if d["kind"] != "Namespace"}
    assert namespaces == {kustomization["namespace"]} == {_one("Namespace")["metadata"]["name"]}


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
    secret, _, key = (k8s.database_url_secret or "").partition("/")
    assert key in _one("Secret", secret)["stringData"]
    assert str(settings.state_dir).startswith("/tmp/"), "the root filesystem is read-only"


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
    assert container["args"] == ["--config", CONFIG_PATH, command]
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
    max_age = config.parse_duration(live[-1])
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
