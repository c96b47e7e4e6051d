"""The `corral` command. Each subcommand checks its arguments, then makes one call.

Exit codes: 0 ok; 1 the operation failed (database unreachable, job not found, ...);
2 bad usage, bad settings or refused input; 3 a heartbeat from an attempt that a newer
one replaced (the job should stop).

    common.py   the state, consoles, exit codes and options every command shares
    render.py   tables, blocks and JSON shapes
    submit.py   corral submit (and --dry-run)
    loops.py    corral serve | dispatcher | reconciler | health
    status.py   corral status
    jobs.py     corral jobs ..., corral dead ...
    admin.py    corral db upgrade | check | lint | heartbeat
    deploy.py   corral deploy rbac
    tenants.py  corral tenants list | show
"""

from __future__ import annotations

import gc
import importlib
import sys
from pathlib import Path

import click

from corral import errors

COMMANDS: dict[str, tuple[str, str]] = {
    "db": ("corral.cli.admin:db", "Manage the database schema."),
    "submit": (
        "corral.cli.submit:submit",
        "Submit a job: corral submit [OPTIONS] -- CMD [ARGS...]; or many: --from-file PATH",
    ),
    "serve": (
        "corral.cli.loops:serve",
        "Run corral: dispatcher, reconciler, scheduler, alerter (with rules), API (with --http).",
    ),
    "api": (
        "corral.cli.loops:api_cmd",
        "Serve the REST API alone (any number of these may run, on any database).",
    ),
    "alerter": (
        "corral.cli.loops:alerter_cmd",
        "Run the alerter alone (reads the run log, sends alerts; any number may run at once).",
    ),
    "alerts": (
        "corral.cli.alerts:alerts",
        "Alert rules and channels: list them, test a channel, see what was sent, mute a rule.",
    ),
    "dispatcher": ("corral.cli.loops:dispatcher_cmd", "Run the dispatcher loop alone."),
    "flows": (
        "corral.cli.flows:flows",
        "Flows: a rate and a parallelism the jobs that name one are held to, per tenant.",
    ),
    "reconciler": (
        "corral.cli.loops:reconciler_cmd",
        "Run the reconciler loop alone (recovery: adopt, relaunch, complete, time out, lost).",
    ),
    "scheduler": (
        "corral.cli.loops:scheduler_cmd",
        "Run the scheduler loop alone (fires schedules; any number may run at once).",
    ),
    "schedules": ("corral.cli.schedules:schedules", "Make and manage schedules (cron, intervals)."),
    "apply": (
        "corral.cli.apply:apply",
        "Make a tenant's flows, schedules, monitors, alert channels and rules what files say.",
    ),
    "export": (
        "corral.cli.apply:export",
        "Write a tenant's objects as YAML documents `corral apply` reads (secrets as `kept`).",
    ),
    "monitors": (
        "corral.cli.monitors:monitors",
        "Monitors: a dead man's switch for crons that run elsewhere, pinged at a URL.",
    ),
    "secrets": (
        "corral.cli.secrets:secrets",
        "Make, rotate and list the secrets HTTP requests are signed with.",
    ),
    "tenants": (
        "corral.cli.tenants:tenants",
        "Each tenant's quotas, what it uses of them, and its weight in the claims.",
    ),
    "tokens": ("corral.cli.tokens:tokens", "Make, list and revoke API tokens."),
    "users": ("corral.cli.users:users", "Add, list and remove dashboard users."),
    "backfill": (
        "corral.cli.schedules:backfill",
        "One job per nominal time of a schedule in [--from, --to), idempotently.",
    ),
    "status": (
        "corral.cli.status:status",
        "corral's processes (serve, dispatcher, ..., worker, api) and whether each is alive.",
    ),
    "health": (
        "corral.cli.loops:health_cmd",
        "Exit 0 when a running corral's loops are alive (its health file is fresh), else 1.",
    ),
    "check": (
        "corral.cli.admin:check",
        "Show how the limits nest (inner < outer, with the margin); exit 1 if one does not.",
    ),
    "jobs": ("corral.cli.jobs:jobs", "Look at and manage jobs."),
    "deploy": (
        "corral.cli.deploy:deploy",
        "Print the manifests corral needs on a cluster.",
    ),
    "lint": (
        "corral.cli.admin:lint_cmd",
        "Check Kubernetes manifests or a live cluster for what would hurt corral; exit 1 on"
        " findings.",
    ),
    "dead": (
        "corral.cli.jobs:dead",
        "Quarantined jobs (poison pills): look at them, retry after a fix, or discard.",
    ),
    "worker": (
        "corral.cli.workers:worker_cmd",
        "Run the Python tasks of MODULE:APP (a corral.App); SIGTERM drains and hands back.",
    ),
    "workers": (
        "corral.cli.workers:workers_cmd",
        "The registered workers, with the tasks and payload versions each reads.",
    ),
    "parked": (
        "corral.cli.workers:parked",
        "Jobs no live worker can read yet: list them, or release them by hand.",
    ),
    "preflight": (
        "corral.cli.workers:preflight",
        "Exit 1 if a stored payload has a version MODULE:APP can neither read nor upcast.",
    ),
    "heartbeat": (
        "corral.cli.admin:heartbeat_cmd",
        "Inside a job: tell corral this attempt is alive (reads CORRAL_JOB_ID, CORRAL_FENCE).",
    ),
}
"""Every command: where it is, and its summary for `corral --help`. A command's module is
imported when the command runs (or shows its own help), so `corral --help` imports none
and a command imports only what it needs."""


class _Commands(click.Group):
    """A group that imports a command's module only when the command is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        if cmd_name not in self.commands:
            module, _, name = COMMANDS[cmd_name][0].partition(":")
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return self.commands[cmd_name]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        width = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [  # shortened as click shortens a loaded command's help
            (name, click.Command(name, help=COMMANDS[name][1]).get_short_help_str(width))
            for name in self.list_commands(ctx)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="corral", prog_name="corral", message="%(prog)s %(version)s")
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Settings file (default ./corral.toml); every command also takes it after its name.",
)
@click.pass_context
def main(ctx: click.Context, config_file: Path | None) -> None:
    """corral: a crash-safe job dispatcher."""
    from corral.cli.common import State

    ctx.obj = State(config_file)


def entrypoint() -> None:
    """Run the CLI, mapping corral's errors to one line and an exit code."""
    # Starting up makes many objects that live until the command ends: the cycle collector
    # would go over them again and again (a third of `corral jobs list`'s time). A command
    # that runs for long (the loops, a bulk submit) turns it back on: `collect_from_here`.
    gc.disable()
    from corral.cli import common  # what the errors need (rich): it is there once a command ran

    try:
        code = main.main(standalone_mode=False)
    except click.exceptions.Abort:
        _fail("aborted", common.EXIT_FAILED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (errors.ConfigError, errors.InvalidInput) as exc:
        _fail(f"error: {exc}", common.EXIT_USAGE)
    except errors.StaleFence as exc:
        _fail(f"error: {exc}", common.EXIT_STALE)
    except errors.CorralError as exc:
        _fail(f"error: {exc}", common.EXIT_FAILED)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    from corral.cli.common import err

    err.print(message, markup=False)
    sys.exit(code)
