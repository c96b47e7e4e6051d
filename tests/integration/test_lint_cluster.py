"""`corral lint --cluster`: a cluster's Deployments and StatefulSets (the API double on
loopback, reached through a kubeconfig and a named context) under the rules manifests get,
in-process and as the command a person runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral import config, errors, lint
from tests.support import kube_api
from tests.support.cli import clean_env, run_corral
from tests.support.net import free_port

pytestmark = pytest.mark.timeout(120)

WORKER = ["corral", "worker", "billing.app:app"]


def workload(
    kind: str,
    namespace: str,
    name: str,
    command: list[str],
    *,
    grace: int | None = None,
    labels: dict[str, str] | None = None,
    lifecycle: dict[str, Any] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "billing:1.4", "command": command}
    if lifecycle:
        container["lifecycle"] = lifecycle
    pod: dict[str, Any] = {"containers": [container]}
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": pod},
    }
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
    }


def kubeconfig(path: Path, url: str) -> Path:
    """Two contexts: `double` (the API double) and the current one, `down` (refused)."""
    down = f"http://127.0.0.1:{free_port()}"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "double", "cluster": {"server": url}},
                    {"name": "down", "cluster": {"server": down}},
                ],
                "users": [{"name": "me", "user": {"token": "not-checked"}}],
                "contexts": [
                    {"name": "double", "context": {"cluster": "double", "user": "me"}},
                    {"name": "down", "context": {"cluster": "down", "user": "me"}},
                ],
                "current-context": "down",
            }
        )
    )
    return path


@dataclass(frozen=True)
class Served:
    """The double, its URL, and a kubeconfig that reaches it as context `double`."""

    api: kube_api.KubeApi
    url: str
    kubeconfig: Path


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    """The double with four workloads: two workers, nginx and a corral dispatcher."""
    double = kube_api.KubeApi()
    async with double, kube_api.server(double) as server:
        for kind, resource, obj in [
            ("Deployment", kube_api.DEPLOYMENTS, workload("Deployment", "jobs", "billing", WORKER)),
            (
                "StatefulSet",
                kube_api.STATEFULSETS,
                workload(
                    "StatefulSet",
                    "jobs",
                    "mail",
                    ["sh", "-c", "exec python -m corral worker mail.app:app"],
                    grace=40,
                    lifecycle={"preStop": {"sleep": {"seconds": 10}}},
                ),
            ),
            ("Deployment", kube_api.DEPLOYMENTS, workload("Deployment", "web", "nginx", ["nginx"])),
            (
                "Deployment",
                kube_api.DEPLOYMENTS,
                workload(
                    "Deployment",
                    "corral",
                    "dispatcher",
                    ["corral", "dispatcher"],
                    labels={"corral.dev/component": "dispatcher"},
                ),
            ),
        ]:
            assert obj["kind"] == kind
            double.put(resource, obj)
        url = str(server.url).rstrip("/")
        yield Served(double, url, kubeconfig(tmp_path / "kubeconfig", url))


def settings_for(path: Path) -> config.Settings:
    return config.Settings(executors={"kubernetes": {"kubeconfig": str(path)}})


async def test_a_clusters_workloads_get_the_rules_of_manifests(
    served: Served,
) -> None:
    path = served.kubeconfig
    found = await lint.lint_cluster(settings_for(path), context="double")
    assert [(f.path, f.line, f.rule) for f in found] == [
        ("cluster:double/corral/Deployment/dispatcher", 0, "grace-period"),
        ("cluster:double/jobs/Deployment/billing", 0, "worker-grace"),
        ("cluster:double/jobs/StatefulSet/mail", 0, "worker-grace"),
    ]
    assert "30 (default) is not above drain_timeout 30s + margin 5s" in found[1].message
    assert "40 less the preStop sleep of 10s leaves 30s" in found[2].message
    assert "set it to at least 46" in found[2].message
    one_namespace = await lint.lint_cluster(settings_for(path), context="double", namespace="web")
    assert one_namespace == []


async def test_refusals_name_the_permission_to_grant(served: Served) -> None:
    double, path = served.api, served.kubeconfig
    refusal = {"kind": "Status", "code": 403, "message": 'User "me" cannot list deployments'}
    double["get /apis/apps/v1/namespaces/jobs/deployments"] << 403 << refusal
    with pytest.raises(errors.ExecutorError) as caught:
        await lint.lint_cluster(settings_for(path), context="double", namespace="jobs")
    assert str(caught.value) == (
        f"listing Deployments in namespace jobs (context double, {served.url}): forbidden"
        ' (403): User "me" cannot list deployments; the identity needs the verb list on'
        " deployments (API group apps) in namespace jobs"
    )


def corral_lint(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    """`corral lint ARGS` in the kubeconfig's folder, on it alone: no corral settings, and
    not as in a pod (no KUBERNETES_SERVICE_HOST)."""
    env = clean_env({"KUBECONFIG": str(kubeconfig)})
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return run_corral(kubeconfig.parent, "lint", *args, env=env, timeout=90)


async def test_the_command_reads_the_context_it_is_given(
    served: Served,
) -> None:
    path = served.kubeconfig
    run = asyncio.to_thread  # the double answers on this loop while the command runs
    told = await run(corral_lint, "--cluster", "--context", "double", kubeconfig=path)
    assert told.returncode == 1, told.stderr
    assert "cluster:double/jobs/Deployment/billing:0: worker-grace: Deployment billing:" in (
        told.stdout
    )
    assert "3 findings" in told.stderr
    as_json = await run(corral_lint, "--cluster", "--context", "double", "--json", kubeconfig=path)
    assert [f["rule"] for f in json.loads(as_json.stdout)] == ["grace-period"] + 2 * [
        "worker-grace"
    ]
    clean = await run(
        corral_lint, "--cluster", "--context", "double", "--namespace", "web", kubeconfig=path
    )
    assert (clean.returncode, clean.stderr.strip()) == (0, "0 findings")


async def test_the_command_says_what_to_do_when_the_cluster_cannot_be_read(
    served: Served, tmp_path: Path
) -> None:
    path = served.kubeconfig
    run = asyncio.to_thread
    down = await run(corral_lint, "--cluster", kubeconfig=path)  # the current context: refused
    assert down.returncode == 1
    assert "error: listing Deployments in all namespaces (context down, http://127.0.0.1:" in (
        down.stderr
    )
    assert "cannot reach the API server" in down.stderr
    unknown = await run(corral_lint, "--cluster", "--context", "nope", kubeconfig=path)
    assert unknown.returncode == 2
    assert "name one of its contexts with --context" in unknown.stderr
    missing = await run(corral_lint, "--cluster", kubeconfig=tmp_path / "no-such-kubeconfig")
    assert missing.returncode == 2
    assert "point KUBECONFIG at the cluster's kubeconfig file" in missing.stderr
    usage = await run(corral_lint, "--context", "double", kubeconfig=path)
    assert usage.returncode == 2
    assert "--context and --namespace are for --cluster" in usage.stderr
