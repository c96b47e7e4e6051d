"""The `corral` command. Each subcommand checks its arguments, then makes one call.

Exit codes: 0 ok; 1 the operation failed (database unreachable, job not found, ...);
2 bad usage, bad settings or refused input; 3 a heartbeat from an attempt that a newer
one replaced (the job should stop).

    common.py   the state, consoles, exit codes and options every command shares
    render.py   tables, blocks and JSON shapes
    submit.py   corral submit (and --dry-run)
    loops.py    corral serve | dispatcher | reconciler | health
    jobs.py     corral jobs ..., corral dead ...
    admin.py    corral db upgrade | check | lint | heartbeat
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from corral import errors
from corral.cli import admin, jobs, loops
from corral.cli.common import EXIT_FAILED, EXIT_STALE, EXIT_USAGE, State, err
from corral.cli.submit import submit


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    ctx.obj = State(config_file)


for command in (
    admin.db,
    submit,
    loops.serve,
    loops.dispatcher_cmd,
    loops.reconciler_cmd,
    loops.health_cmd,
    admin.check,
    jobs.jobs,
    admin.lint_cmd,
    jobs.dead,
    admin.heartbeat_cmd,
):
    main.add_command(command)


def entrypoint() -> None:
    """Run the CLI, mapping corral's errors to one line and an exit code."""
    try:
        code = main.main(standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(EXIT_FAILED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (errors.ConfigError, errors.InvalidInput) as exc:
        err.print(f"error: {exc}", markup=False)
        sys.exit(EXIT_USAGE)
    except errors.StaleFence as exc:
        err.print(f"error: {exc}", markup=False)
        sys.exit(EXIT_STALE)
    except errors.CorralError as exc:
        err.print(f"error: {exc}", markup=False)
        sys.exit(EXIT_FAILED)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
