"""corral's own executors, as pyproject.toml registers them in the `corral.executors`
entry-point group (see registry.py). The cluster executors' modules are imported only
when one is asked for: the Kubernetes clients take most of a second to load, which every
other command (`corral heartbeat` inside a job, say) would pay for nothing."""

from __future__ import annotations

import importlib
from datetime import datetime
from pathlib import Path
from typing import Any

from corral import clock, config, errors, model
from corral.executors.base import Executor
from corral.executors.process import ProcessExecutor
from corral.executors.registry import Registration, SpecChecker


def _process(settings: config.Settings, clk: clock.Clock) -> Executor:
    return ProcessExecutor(
        root=settings.process_root,
        clock=clk,
        kill_grace=settings.timeouts.cancel_grace.total_seconds(),
        retention=settings.executors.process.retention,
        log_bytes=settings.executors.process.log_bytes,
        strangers=_strangers(settings),
        state_dir=settings.state_dir,
    )


def _strangers(settings: config.Settings) -> dict[str, Any] | None:
    """How tenants' process commands run (see process_sandbox), or None: as corral."""
    own = settings.executors.process
    if not own.strangers:
        return None
    corral_paths = [Path.cwd(), settings.state_dir, settings.process_root, Path("/etc/corral")]
    for path in (settings.sqlite_file, settings.settings_file):
        if path is not None:
            corral_paths.append(path)
    return {
        "uids": own.uids,
        "sandbox": own.sandbox,
        "hide": sorted({str(p.absolute()) for p in corral_paths}),
        "shown": [str(settings.attempt_socket.parent)],  # the attempt API's socket
    }


def _cluster_reach(settings: config.Settings) -> str | None:
    if settings.api_url:
        return None
    if settings.jobs_get_database_url and settings.executors.kubernetes.database_url_secret:
        return None
    return (
        "a job on Kubernetes cannot reach corral to send heartbeats; set api_url (or, to"
        " hand jobs the database itself, executors.kubernetes.database_url_secret with"
        " jobs_get_database_url on)"
    )


def _http(settings: config.Settings, clk: clock.Clock) -> Executor:
    from corral.executors import http

    return http.build(settings, clk)


def _http_checker(settings: config.Settings) -> SpecChecker:
    from corral.executors import http

    return http.SpecCheck(settings)


CLUSTER_LIBRARIES = frozenset({"kubernetes", "kubernetes_validate", "hera"})
"""What the cluster executors need beside corral: the `kubernetes` extra."""


def cluster_module(name: str, what: str = "") -> Any:
    """corral.executors.`name` (kubernetes, argo, kube_client), or ConfigError saying how
    to install what it needs (`what` needs it: by default the executor `name`): `make run`
    and a plain install leave the Kubernetes libraries out."""
    try:
        return importlib.import_module(f"corral.executors.{name}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in CLUSTER_LIBRARIES:
            raise
        raise errors.ConfigError(
            f"{what or f'the {name} executor'} needs the Kubernetes libraries ({exc.name} is"
            " not installed): pip install 'corral[kubernetes]'"
        ) from None


def _kubernetes(settings: config.Settings, clk: clock.Clock) -> Executor:
    made: Executor = cluster_module("kubernetes").KubernetesExecutor(settings=settings, clock=clk)
    return made


def _kubernetes_checker(settings: config.Settings) -> SpecChecker:
    made: SpecChecker = cluster_module("kubernetes").JobTemplate(settings)
    return made


def _kubernetes_dry_run(job: model.NewJob, settings: config.Settings, now: datetime) -> Any:
    return cluster_module("kubernetes").dry_run(job, settings, now)


def _argo(settings: config.Settings, clk: clock.Clock) -> Executor:
    made: Executor = cluster_module("argo").ArgoExecutor(settings=settings, clock=clk)
    return made


def _argo_checker(settings: config.Settings) -> SpecChecker:
    made: SpecChecker = cluster_module("argo").WorkflowTemplate(settings)
    return made


def _argo_dry_run(job: model.NewJob, settings: config.Settings, now: datetime) -> Any:
    return cluster_module("argo").dry_run(job, settings, now)


def _kubernetes_rules() -> Any:
    return cluster_module("kubernetes").RULES


def _argo_rules() -> Any:
    return cluster_module("argo").RULES


PROCESS = Registration(
    kind="process",
    summary="a local process in a run folder, supervised (the embedded default)",
    build=_process,
)
HTTP = Registration(
    kind="http",
    summary="one HTTP request (httpx), to public addresses unless executors.http.allow_networks",
    build=_http,
    checker=_http_checker,
)
KUBERNETES = Registration(
    kind="kubernetes",
    summary="a batch/v1 Job in executors.kubernetes.namespace",
    build=_kubernetes,
    checker=_kubernetes_checker,
    dry_run=_kubernetes_dry_run,
    container=True,
    reach=_cluster_reach,
    rules=_kubernetes_rules,
)
ARGO = Registration(
    kind="argo",
    summary="an Argo Workflow (one container step) in executors.kubernetes.namespace",
    build=_argo,
    checker=_argo_checker,
    dry_run=_argo_dry_run,
    container=True,
    reach=_cluster_reach,
    rules=_argo_rules,
)
