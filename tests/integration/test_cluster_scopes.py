"""A tenant's Kubernetes and Argo jobs, tried as a stranger would: they run in the tenant's
own namespace and name only the Secrets, ConfigMaps and service accounts its table
allows, never corral's own. Every way a spec can name one is tried through the API (a
submit and a schedule), refused (403, naming the field and the setting) unless allowed;
an allowed one goes on to the Job as the kubelet would read it (a dry run)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pydantic
import pytest

from corral import client, config, model, store
from corral.executors import kubernetes, references
from corral.testing import FrozenClock
from tests.support.api import as_operator_of
from tests.support.noop import NoopExecutor

BASE = {"image": "busybox:1.36", "command": ["true"]}
WAYS: dict[str, tuple[dict[str, Any], str, str]] = {
    # A spec's way of naming an object: the spec, the field named, and the kind.
    "env secret": ({"env": {"U": {"secret": "{}", "key": "url"}}}, "env.U.secret", "secret"),
    "env config map": (
        {"env": {"R": {"config_map": "{}", "key": "region"}}},
        "env.R.config_map",
        "config_map",
    ),
    "env_from secret": ({"env_from": [{"secret": "{}"}]}, "env_from[0].secret", "secret"),
    "env_from config map": (
        {"env_from": [{"config_map": "{}"}]},
        "env_from[0].config_map",
        "config_map",
    ),
    "secret volume": (
        {"volumes": [{"name": "s", "secret": {"secretName": "{}"}}]},
        "volumes[0].secret.secretName",
        "secret",
    ),
    "config map volume": (
        {"volumes": [{"name": "c", "configMap": {"name": "{}"}}]},
        "volumes[0].configMap.name",
        "config_map",
    ),
    "projected secret": (
        {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "{}"}}]}}]},
        "volumes[0].projected.sources[0].secret.name",
        "secret",
    ),
    "projected config map": (
        {"volumes": [{"name": "p", "projected": {"sources": [{"configMap": {"name": "{}"}}]}}]},
        "volumes[0].projected.sources[0].configMap.name",
        "config_map",
    ),
    "pull secret": ({"image_pull_secrets": ["{}"]}, "image_pull_secrets[0]", "secret"),
    "sidecar env": (
        {
            "sidecars": [
                {
                    "name": "proxy",
                    "image": "envoy:1.31",
                    "command": ["envoy"],
                    "env": {"K": {"secret": "{}", "key": "k"}},
                }
            ]
        },
        "sidecars[0].env.K.secret",
        "secret",
    ),
    "service account": ({"service_account": "{}"}, "service_account", "service_account"),
}
ALLOWED = {"secret": "team-b-db", "config_map": "team-b-settings", "service_account": "team-b"}


def named(way: str, name: str) -> dict[str, Any]:
    spec, _, _ = WAYS[way]
    return {**BASE, **_fill(spec, name)}


def _fill(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, name) for v in value]
    return name if value == "{}" else value


SETTINGS = config.Settings(
    executors={  # type: ignore[arg-type]
        "enabled": ["process", "http", "kubernetes"],
        "kubernetes": {
            "namespace": "jobs",
            "namespaces": ["jobs", "team-b"],
            "allowed_service_accounts": ["runner", "team-b"],
            "database_url_secret": "db-of-corral/url",
        },
    },
    tenants={  # type: ignore[dict-item]
        "b": {
            "executors": ["http", "python", "kubernetes"],
            "namespace": "team-b",
            "allowed_secrets": ["team-b-db", "db-of-corral", "corral-17-1"],
            "allowed_config_maps": ["team-b-settings"],
            "service_accounts": ["team-b"],
        }
    },
    jobs_get_database_url=False,
)


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    return client.Client(
        store=db,
        executors={"noop": NoopExecutor()},
        checkers={"noop": NoopExecutor(), "kubernetes": kubernetes.JobTemplate(SETTINGS)},
        settings=SETTINGS,
        clock=FrozenClock(),
    )


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with as_operator_of(c, "b") as made:
        yield made


async def _submit(http: httpx.AsyncClient, spec: dict[str, Any]) -> list[httpx.Response]:
    job = {"executor": "kubernetes", "spec": spec}
    schedule = {"name": "s", "every": "1h", **job}
    return [
        await http.post("/api/v1/jobs", json=job),
        await http.post("/api/v1/schedules", json=schedule),
    ]


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("whose", ["not allowed", "corral's database", "an attempt's token"])
async def test_a_name_the_tenant_may_not_use_is_refused_every_way(
    way: str, whose: str, http: httpx.AsyncClient, c: client.Client
) -> None:
    _, field, kind = WAYS[way]
    name = {"not allowed": "team-a-db", "corral's database": "db-of-corral"}.get(
        whose, "corral-17-1"
    )
    if kind != "secret" and whose != "not allowed":
        name = {"config_map": "corral-17-1-payload", "service_account": "corral-17-1"}[kind]
    for answer in await _submit(http, named(way, name)):
        assert answer.status_code == 403, answer.text
        said = answer.json()["error"]
        assert said.startswith(f"spec.{field}: {name!r} is ")
        if whose == "not allowed":
            assert f"tenants.b.{references.ALLOWED_IN[kind][0]}" in said
        else:
            assert "is corral's own" in said
    assert await c.store.jobs.list(model.JobFilter(states=[]), limit=10) == []
    assert await c.schedules() == []


@pytest.mark.parametrize("way", sorted(WAYS))
async def test_a_name_the_tenant_may_use_goes_on_to_its_job_in_its_namespace(
    way: str, http: httpx.AsyncClient, c: client.Client
) -> None:
    _, _, kind = WAYS[way]
    made, scheduled = await _submit(http, named(way, ALLOWED[kind]))
    assert made.status_code == 201, made.text
    assert scheduled.status_code == 201, scheduled.text
    job = (await c.job(made.json()["id"])).job
    assert job.spec["namespace"] == "team-b"
    manifest = kubernetes.dry_run(
        model.NewJob(executor="kubernetes", spec=job.spec, tenant="b"),
        SETTINGS,
        datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert manifest["metadata"]["namespace"] == "team-b"
    assert ALLOWED[kind] in str(manifest["spec"]["template"]["spec"])


async def test_another_namespace_is_refused(http: httpx.AsyncClient) -> None:
    for answer in await _submit(http, {**BASE, "namespace": "jobs"}):
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"] == (
            "spec.namespace: tenant 'b' runs its cluster jobs in its own namespace 'team-b'"
            " (tenants.b.namespace), not 'jobs'"
        )


def test_a_cluster_grant_needs_a_namespace_of_corral_s() -> None:
    k8s_on = {"enabled": ["process", "http", "kubernetes"]}
    with pytest.raises(pydantic.ValidationError, match=r"tenants\.b\.namespace: required where"):
        config.Settings(executors=k8s_on, tenants={"b": {"executors": ["kubernetes"]}})  # type: ignore[arg-type, dict-item]
    with pytest.raises(pydantic.ValidationError, match=r"'team-b' is not one of executors"):
        config.Settings(
            executors=k8s_on,  # type: ignore[arg-type]
            tenants={"b": {"executors": ["kubernetes"], "namespace": "team-b"}},  # type: ignore[dict-item]
        )
