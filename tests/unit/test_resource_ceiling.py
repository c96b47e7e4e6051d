"""The ceiling on what one container may ask for (`executors.kubernetes.max_resources`): a
spec above it is refused at submit by both cluster executors, and settings whose defaults
or placement classes are above it do not start."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from corral import config, errors
from corral.executors import argo, kubernetes

CEILING = {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}
SIDECAR = {
    "name": "proxy",
    "image": "envoy:1.31",
    "command": ["envoy"],
    "resources": {"limits": {"memory": "33Gi"}},
}
TEMPLATES = {"kubernetes": kubernetes.JobTemplate, "argo": argo.WorkflowTemplate}


def settings(**k8s_settings: Any) -> config.Settings:
    return config.Settings(executors={"kubernetes": {"max_resources": CEILING, **k8s_settings}})


def spec(**fields: Any) -> dict[str, Any]:
    return {"image": "busybox:1.36", "command": ["true"], **fields}


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"resources": {"limits": {"memory": "64Gi"}}},
            "resources.limits.memory: 64Gi is more than executors.kubernetes.max_resources"
            " allows (32Gi)",
        ),
        (
            {"resources": {"requests": {"cpu": "8500m"}}},
            "resources.requests.cpu: 8500m is more than executors.kubernetes.max_resources"
            " allows (8)",
        ),
        (
            {"resources": {"limits": {"nvidia.com/gpu": "4"}}},
            "resources.limits.nvidia.com/gpu: 4 is more than",
        ),
        (
            {"sidecars": [SIDECAR]},
            "sidecars[0].resources.limits.memory: 33Gi is more than",
        ),
    ],
)
def test_a_spec_above_the_ceiling_is_refused_at_submit_naming_field_and_rule(
    kind: str, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(errors.InvalidInput) as caught:
        TEMPLATES[kind](settings()).validate_spec(spec(**fields))
    assert str(caught.value).startswith(f"{kind} spec: {message}")


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_up_to_the_ceiling_is_allowed_and_unnamed_resources_are_not_bounded(kind: str) -> None:
    amounts = {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2", "ephemeral-storage": "1Ti"}
    resources = {"requests": dict(amounts), "limits": dict(amounts)}
    normal = TEMPLATES[kind](settings()).validate_spec(spec(resources=resources))
    assert normal["resources"] == resources
    huge = spec(resources={"limits": {"memory": "1Pi"}})
    assert TEMPLATES[kind](config.Settings()).validate_spec(huge), "no ceiling by default"


@pytest.mark.parametrize(
    ("k8s_settings", "message"),
    [
        (
            {"default_resources": {"limits": {"memory": "64Gi"}}},
            "executors.kubernetes.default_resources.limits.memory: 64Gi is more than"
            " executors.kubernetes.max_resources allows (32Gi)",
        ),
        (
            {"placements": {"big": {"resources": {"requests": {"cpu": "16"}}}}},
            "executors.kubernetes.placements.big.resources.requests.cpu: 16 is more than"
            " executors.kubernetes.max_resources allows (8)",
        ),
        (
            {"max_resources": {"memory": "lots"}},
            "executors.kubernetes.max_resources.memory: 'lots' is not a quantity",
        ),
        (
            {"max_resources": {"bad name!": "1"}},
            "executors.kubernetes.max_resources: 'bad name!' is not a resource name",
        ),
    ],
)
def test_settings_above_the_ceiling_do_not_start(
    k8s_settings: dict[str, Any], message: str
) -> None:
    s = settings(**k8s_settings)
    for template in TEMPLATES.values():
        with pytest.raises(errors.ConfigError, match=re.escape(message)):
            template(s)


def test_the_ceiling_reads_from_a_settings_file(tmp_path: Path) -> None:
    cfg = tmp_path / "corral.toml"
    cfg.write_text(
        '[executors.kubernetes]\nmax_resources = { cpu = "4", "nvidia.com/gpu" = "1" }\n'
        'default_resources = { requests = { cpu = "5" } }\n'
    )
    loaded = config.Settings.load(cfg)
    assert loaded.executors.kubernetes.max_resources == {"cpu": "4", "nvidia.com/gpu": "1"}
    with pytest.raises(errors.ConfigError, match=r"default_resources\.requests\.cpu: 5 is more"):
        kubernetes.JobTemplate(loaded)
