"""`corral db`, `check`, `lint` and `heartbeat`: the schema, the chain of limits, manifests,
and the one command a job runs from inside."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from corral import timeouts
from corral.cli import render
from corral.cli.common import EXIT_FAILED, State, config_option, err, json_option, out, print_json
from corral.cli.common import run as run_async

if TYPE_CHECKING:
    from corral import config


@click.group()
def db() -> None:
    """Manage the database schema."""


@db.command("upgrade")
@config_option
@click.pass_obj
def db_upgrade(state: State) -> None:
    """Create or upgrade the schema to this corral's newest revision."""
    from corral.client import schema

    before, after = run_async(schema.upgrade(state.settings()))
    if before == after:
        out.print(f"database is up to date (revision {after})")
    else:
        out.print(f"database upgraded from {before or 'empty'} to revision {after}")


@click.command()
@json_option
@config_option
@click.pass_obj
def check(state: State, as_json: bool) -> None:
    """Show how the limits nest (inner < outer, with the margin); exit 1 if one does not.

    Where the database can be reached, also the loops that run and the work that waits for
    a loop nobody runs (as `corral status`), what could hand corral's secrets to others (a
    settings file or database other users can read, jobs given the database's URL), and
    public_url unset while monitors or alert rules need it; those are warnings, never a
    failure."""
    from corral.cli import exposure, status

    settings = state.settings(check_chain=False)
    broken = timeouts.chain_violations(settings)
    exposed = exposure.warnings(settings, state.config_file)
    seen = (
        run_async(status.looked(settings))
        if not broken
        else "not looked at: the limits do not nest"
    )
    public = [] if isinstance(seen, str) else run_async(_public(settings))
    if as_json:
        print_json(_check_json(settings, seen, exposed, public))
    else:
        out.print(render.chain_table(settings))
        for line in broken:
            err.print(f"error: {line}", markup=False)
    if broken:
        raise SystemExit(EXIT_FAILED)
    if not as_json:
        _print_nested(settings)
        if isinstance(seen, str):
            err.print(f"loops: not looked at ({seen})", markup=False)
        else:
            status.print_status(seen)
        for line in [*exposed, *public]:
            err.print(f"warning: {line}", markup=False)


async def _public(settings: config.Settings) -> list[str]:
    """What `corral check` says of public_url (client.monitors.public_warnings)."""
    from corral import runtime

    async with runtime.connect(settings, platforms=False) as c:
        return await c.public_warnings()


def _print_nested(settings: config.Settings) -> None:
    """That every limit that applies nests, with the margins, and which do not apply."""

    margin = settings.timeouts.margin.total_seconds()
    tick = settings.timeouts.tick_margin.total_seconds()
    checks = timeouts.chain(settings)
    unused = sum(not c.applies for c in checks)
    pg = sum(not c.applies and c.link.postgres_only for c in checks)
    pods = unused - pg
    parts = [f"{pg} links for PostgreSQL, unused on SQLite"] if pg else []
    parts += [f"{pods} for pods, with no kubernetes or argo executor"] if pods else []
    note = f"; n/a: {', '.join(parts)}" if parts else ""
    out.print(
        f"all {len(timeouts.CHAIN) - unused} limits nest"
        f" (margin {margin:g}s, tick margin {tick:g}s){note}"
    )


def _check_json(
    settings: config.Settings, seen: Any, exposed: list[str], public: list[str]
) -> dict[str, Any]:
    """`corral check --json`: the chain, the loops, and the warnings."""
    return {
        **render.chain_dict(settings),
        "status": _status_json(seen),
        "exposed": exposed,
        "public_url": public,
    }


def _status_json(seen: Any) -> dict[str, Any]:
    from corral import shapes

    return {"error": seen} if isinstance(seen, str) else shapes.status_dict(seen)


@click.command("lint")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--cluster",
    is_flag=True,
    help="Read the Deployments and StatefulSets of a live cluster too, reached as the"
    " kubernetes executor reaches it (its kubeconfig, KUBECONFIG, or the pod's account).",
)
@click.option("--context", help="With --cluster: the kubeconfig context (default: the current).")
@click.option("--namespace", help="With --cluster: only this namespace (default: all).")
@json_option
@config_option
@click.pass_obj
def lint_cmd(
    state: State,
    paths: tuple[Path, ...],
    cluster: bool,
    context: str | None,
    namespace: str | None,
    as_json: bool,
) -> None:
    """Check Kubernetes manifests or a live cluster for what would hurt corral; exit 1 on findings.

    Reads the manifests of PATH... (files, or folders read recursively), or with --cluster
    the workloads of a live cluster; notes alone do not fail."""
    from corral import lint

    if not cluster and (context is not None or namespace is not None):
        raise click.UsageError("--context and --namespace are for --cluster")
    if not paths and not cluster:
        raise click.UsageError("give manifests to read (PATH...), or --cluster")
    settings = state.settings(check_chain=False)
    findings = lint.lint_paths(paths, settings) if paths else []
    if cluster:
        findings += run_async(lint.lint_cluster(settings, context=context, namespace=namespace))
    failing = sum(f.level == lint.ERROR for f in findings)
    if as_json:
        print_json([f.as_dict() for f in findings])
    else:
        for finding in findings:
            out.print(str(finding), markup=False, highlight=False, soft_wrap=True)
        notes = len(findings) - failing
        told = f", {notes} note{'s' * (notes != 1)}" if notes else ""
        err.print(f"{failing} finding{'s' * (failing != 1)}{told}")
    if failing:
        raise SystemExit(EXIT_FAILED)


@click.command("heartbeat")
@config_option
@click.pass_obj
def heartbeat_cmd(state: State) -> None:
    """Inside a job: tell corral this attempt is alive (reads CORRAL_JOB_ID, CORRAL_FENCE).

    Exits 3 when a newer attempt has replaced this one: the job should stop."""
    from corral import worker

    settings = state.settings(check_chain=False)
    lease = worker.heartbeat(worker.current_attempt(), settings)
    if lease is not None:
        out.print(f"lease renewed until {lease.isoformat()}")
