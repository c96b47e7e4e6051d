"""corral's own executors, as pyproject.toml registers them in the `corral.executors`
entry-point group (see registry.py). The cluster executors' modules are imported only
when one is asked for: the Kubernetes clients take most of a second to load, which every
other command (`corral heartbeat` inside a job, say) would pay for nothing."""

from __future__ import annotations

import importlib
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from corral import errors
from corral.executors import http_settings, kubernetes_settings, process_settings
from corral.executors.registry import Registration, SpecChecker

if TYPE_CHECKING:  # settings read this module: it imports no executor until one is built
    from corral import clock, config, model
    from corral.executors.base import Executor


def _process(settings: config.Settings, clk: clock.Clock) -> Executor:
    from corral.executors.process import ProcessExecutor

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


def _cluster(
    kind: str,
    summary: str,
    *,
    executor: str,
    template: str,
    settings_model: type[BaseModel] | None = None,
) -> Registration:
    """The registration of a cluster executor: its module (corral.executors.`kind`, which
    needs the kubernetes extra) imported only when it is asked for; `executor` and
    `template` name its Executor and its spec checker there. Both read the table
    `[executors.kubernetes]`, which the kubernetes executor's registration names."""

    def build(settings: config.Settings, clk: clock.Clock) -> Executor:
        made: Executor = getattr(cluster_module(kind), executor)(settings=settings, clock=clk)
        return made

    def checker(settings: config.Settings) -> SpecChecker:
        made: SpecChecker = getattr(cluster_module(kind), template)(settings)
        return made

    def dry_run(job: model.NewJob, settings: config.Settings, now: datetime) -> Any:
        return cluster_module(kind).dry_run(job, settings, now)

    def rules() -> Any:
        return cluster_module(kind).RULES

    return Registration(
        kind=kind,
        summary=summary,
        build=build,
        checker=checker,
        dry_run=dry_run,
        container=True,
        reach=_cluster_reach,
        rules=rules,
        settings_model=settings_model,
    )


PROCESS = Registration(
    kind="process",
    summary="a local process in a run folder, supervised (the embedded default)",
    build=_process,
    settings_model=process_settings.ProcessExecutorSettings,
)
HTTP = Registration(
    kind="http",
    summary="one HTTP request (httpx), to public addresses unless executors.http.allow_networks",
    build=_http,
    checker=_http_checker,
    settings_model=http_settings.HttpExecutorSettings,
)
KUBERNETES = _cluster(
    "kubernetes",
    "a batch/v1 Job in executors.kubernetes.namespace",
    executor="KubernetesExecutor",
    template="JobTemplate",
    settings_model=kubernetes_settings.KubernetesExecutorSettings,
)
ARGO = _cluster(
    "argo",
    "an Argo Workflow (one container step) in executors.kubernetes.namespace",
    executor="ArgoExecutor",
    template="WorkflowTemplate",
)
