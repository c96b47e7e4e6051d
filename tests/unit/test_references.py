"""Every object a cluster spec names, as the kubelet would read it: the walk over a
normalised spec, for the ways the API test does not submit (volume types whose Secret is
a `secretRef`, `nodePublishSecretRef` or `secretName` of their own)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from corral import config, scheduling
from corral.executors import references
from corral.executors.references import Reference


def test_volume_types_that_name_a_secret_of_their_own_are_read() -> None:
    spec = {
        "volumes": [
            {"name": "a", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "s1"}}},
            {"name": "b", "cephfs": {"monitors": ["m"], "secretRef": {"name": "s2"}}},
            {"name": "c", "azureFile": {"secretName": "s3", "shareName": "x"}},
            {"name": "d", "emptyDir": {}},
        ]
    }
    assert list(references.references(spec)) == [
        Reference("volumes[0].csi.nodePublishSecretRef.name", "secret", "s1"),
        Reference("volumes[1].cephfs.secretRef.name", "secret", "s2"),
        Reference("volumes[2].azureFile.secretName", "secret", "s3"),
    ]


def test_a_spec_that_names_nothing_names_nothing() -> None:
    assert list(references.references({"image": "busybox", "command": ["true"]})) == []


def test_a_tenants_schedule_is_checked_again_at_every_firing() -> None:
    """What a schedule names is checked when it is made, and again at each firing: a name
    the operator takes out of the tenant's table since is refused then."""

    def settings(secrets: list[str]) -> config.Settings:
        return config.Settings(
            executors={
                "enabled": ["process", "http", "kubernetes"],
                "kubernetes": {"namespace": "jobs", "namespaces": ["jobs", "team-b"]},
            },
            tenants={
                "b": {
                    "executors": ["kubernetes"],
                    "namespace": "team-b",
                    "allowed_secrets": secrets,
                }
            },
        )

    spec: dict[str, Any] = {
        "image": "busybox:1.36",
        "command": ["true"],
        "namespace": "team-b",
        "env": {"U": {"secret": "warehouse", "key": "url"}},
    }
    schedule = cast(
        scheduling.Schedule,
        SimpleNamespace(tenant="b", template={"executor": "kubernetes", "spec": spec}),
    )
    assert references.firing_refusal(settings(["warehouse"]))(schedule) is None
    said = references.firing_refusal(settings([]))(schedule)
    assert said is not None
    assert "'warehouse' is not one of the Secrets tenant 'b' may name" in said
    moved = {**spec, "namespace": "jobs"}
    elsewhere = cast(
        scheduling.Schedule,
        SimpleNamespace(tenant="b", template={"executor": "kubernetes", "spec": moved}),
    )
    assert "its own namespace" in (
        references.firing_refusal(settings(["warehouse"]))(elsewhere) or ""
    )
    withdrawn = config.Settings(tenants={"b": {"executors": ["http"]}})
    assert "not granted 'kubernetes'" in (references.firing_refusal(withdrawn)(schedule) or "")
