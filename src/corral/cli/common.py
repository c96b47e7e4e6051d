"""What every `corral` command shares: the top-level state, the consoles, the exit codes,
the `--config` option (taken before or after a command's name), and running a coroutine."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console

from corral import errors

if TYPE_CHECKING:
    from corral import client, config

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_FAILED, EXIT_USAGE, EXIT_STALE = 1, 2, 3
JOB_ID = click.IntRange(1, 2**63 - 1)


class State:
    """What the top-level options hand to subcommands."""

    def __init__(self, config_file: Path | None) -> None:
        self.config_file = config_file
        self.overrides: dict[str, Any] = {}  # settings given as options (--log-format)

    def settings(
        self, *, check_chain: bool = True, health_file: Path | None = None
    ) -> config.Settings:
        """The settings from the config file and CORRAL_* environment, with the options'
        (and a loop's --health-file)."""
        from corral import config  # pydantic: only for a command that runs, never for --help

        given = {**self.overrides, **({"health_file": health_file} if health_file else {})}
        return config.Settings.load(self.config_file, check_chain=check_chain, **given)

    def connect(self, *, platforms: bool = True) -> AbstractAsyncContextManager[client.Client]:
        """A client of the store these settings name (`runtime.connect`); with `platforms`
        off, one that starts no executor (to read, or to store jobs)."""
        from corral import runtime

        return runtime.connect(self.settings(), platforms=platforms)


def _take_log_format(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.ensure_object(State).overrides["log_format"] = value


def log_format_option(fn: F) -> F:
    """`--log-format text|json` on a long-running command (the log_format setting)."""
    option = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default=None,
        expose_value=False,
        is_eager=True,
        callback=_take_log_format,
        help="How to log: text (a line a record) or json (an object a line); default: the"
        " log_format setting.",
    )
    return option(fn)


def _take_config(ctx: click.Context, _: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.ensure_object(State).config_file = value


def config_option(fn: F) -> F:
    """`--config PATH` on a command itself, so `corral jobs list --config x.toml` works as
    well as `corral --config x.toml jobs list` (the one given last wins)."""
    option = click.option(
        "--config",
        type=click.Path(path_type=Path, dir_okay=False),
        expose_value=False,
        is_eager=True,
        callback=_take_config,
        help="Settings file (default ./corral.toml).",
    )
    return option(fn)


def json_option(fn: F) -> F:
    """`--json`: print the result as one JSON document (shapes in the CLI reference)."""
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(fn)


def collect_from_here() -> None:
    """For a command that runs for long: what was made so far stays (out of the cycle
    collector's passes, which then cost what the command holds, not what it imported), and
    the collector, off while the command started (`entrypoint`), is on again."""
    gc.freeze()
    gc.enable()


def run(coro: Coroutine[Any, Any, T]) -> T:
    import asyncio

    return asyncio.run(coro)


def warn(lines: list[str]) -> None:
    """Each line on stderr as a warning, plain (a quota's table, `[tenants.acme]`, is no
    console markup), so `--json` output on stdout stays one document."""
    for line in lines:
        click.echo(f"warning: {line}", err=True)


def print_json(data: Any) -> None:
    """One JSON document on stdout, plain (no console wrapping: it is meant for programs)."""
    click.echo(json.dumps(data, indent=2, default=str))


def parse_json(option: str, text: str | None) -> Any:
    """The JSON value of an option, or InvalidInput naming the option."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.InvalidInput(f"{option}: not valid JSON ({exc})") from None
