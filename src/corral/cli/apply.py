"""`corral apply` (make a tenant's flows, schedules, monitors, alert channels and rules what
YAML or TOML files say, in one transaction, printing what it does to each) and `corral export`
(what a tenant has, as documents apply reads back as nothing to do). The operator's
commands: `--tenant` names the tenant (default: default); a tenant applies its own through
the API (POST /api/v1/apply)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from corral import errors
from corral.cli.common import State, config_option, err, json_option, out, print_json, run

if TYPE_CHECKING:
    from corral import documents

tenant_option = click.option(
    "--tenant", default="default", show_default=True, help="Whose objects (the operator's choice)."
)


def _read(paths: tuple[str, ...]) -> list[documents.Document]:
    """The documents of each path: a file, a folder's files (.yaml, .yml, .json, .toml, by
    name, not its subfolders), or `-` (YAML on standard input)."""
    from corral import documents

    found: list[documents.Document] = []
    for given in paths:
        if given == "-":
            found.extend(documents.parse(sys.stdin.read(), "-"))
            continue
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in documents.SUFFIXES)
        elif path.is_file():
            files = [path]
        else:
            raise errors.InvalidInput(f"-f: {given}: no such file or folder")
        for file in files:
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise errors.InvalidInput(f"{file}: cannot be read: {exc}") from None
            found.extend(documents.parse(text, str(file)))
    return found


@click.command("apply")
@click.option(
    "-f",
    "--filename",
    "paths",
    multiple=True,
    required=True,
    help="A file, or a folder of files (.yaml, .yml, .json, .toml); - reads YAML from"
    " standard input. Repeat for more.",
)
@tenant_option
@click.option(
    "--prune", is_flag=True, help="Delete the objects apply made that the files no longer hold."
)
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
@json_option
@config_option
@click.pass_obj
def apply(
    state: State, paths: tuple[str, ...], tenant: str, prune: bool, dry_run: bool, as_json: bool
) -> None:
    """Make a tenant's flows, schedules, monitors, alert channels and rules what files say."""
    from corral import documents

    given = _read(paths)

    async def go() -> list[documents.Step]:
        async with state.connect(platforms=False) as c:
            return await c.apply(tenant, given, prune=prune, dry_run=dry_run)

    steps = run(go())
    if as_json:
        print_json(documents.plan_dict(tenant, steps, dry_run=dry_run))
        return
    for line in documents.plan_lines(steps):
        out.print(line, markup=False)
    done = "dry run: nothing changed" if dry_run else "applied"
    err.print(f"tenant {tenant}: {documents.summary(steps)}; {done}", markup=False)


@click.command("export")
@tenant_option
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    help="Only objects of this kind, e.g. Flow, Schedule or AlertRule (repeat for more).",
)
@json_option
@config_option
@click.pass_obj
def export(state: State, tenant: str, kinds: tuple[str, ...], as_json: bool) -> None:
    """Write a tenant's objects as YAML documents `corral apply` reads (secrets as `kept`)."""
    from corral import documents

    async def go() -> list[dict[str, Any]]:
        async with state.connect(platforms=False) as c:
            return await c.export(tenant, kinds)

    click.echo(documents.dumped(run(go()), as_json=as_json), nl=False)
