"""`corral serve`, `dispatcher` and `reconciler`: the long-running loops, with logging,
signal handling and the demo jobs of `make run`; and `corral health`, their probe."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from corral import durations, errors, health
from corral.cli.common import (
    State,
    collect_from_here,
    config_option,
    err,
    log_format_option,
    out,
    run,
)

if TYPE_CHECKING:
    from corral import client, config, runtime

DEMO_JOBS: list[dict[str, Any]] = [
    {"key": "demo-hello", "command": ["sh", "-c", "echo hello from corral; sleep 1"]},
    {"key": "demo-urgent", "command": ["sh", "-c", "echo urgent work first"], "priority": 10},
    {"key": "demo-slow", "command": ["sh", "-c", "echo working; sleep 5; echo done"]},
    {
        "key": "demo-env",
        "command": [
            "sh",
            "-c",
            "echo job $CORRAL_JOB_ID attempt $CORRAL_ATTEMPT fence $CORRAL_FENCE",
        ],
    },
    {
        "key": "demo-flaky",
        "command": ["sh", "-c", "echo failing on purpose >&2; exit 3"],
        "max_attempts": 2,
    },
]


def setup_logging(settings: config.Settings) -> None:
    from corral import logs

    logs.setup(settings.log_level, settings.log_format)


async def until_signalled(body: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `body(stop)`; SIGTERM or SIGINT sets `stop` so the body can end cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await body(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


@dataclass(frozen=True, slots=True)
class Serving:
    """What one process runs: its loops (dispatch, reconcile, schedule, alert, operate),
    the API on `http` (bound already to `sock`), the demo's jobs; `kind` names it in the
    loops table."""

    loops: tuple[str, ...]
    demo: bool = False
    http: str | None = None
    kind: str = "serve"
    sock: socket.socket | None = None

    def runs(self, loop: str) -> bool:
        return loop in self.loops

    def answers_attempts(self, settings: config.Settings) -> bool:
        """Whether it answers the attempt API on a Unix socket in the state folder. Process
        jobs reach corral through the attempt API: api_url's, else that of the process that
        launched them (a dispatcher, or a reconciler relaunching); never through the
        database's URL, by default."""
        launches = self.runs("dispatch") or self.runs("reconcile")
        enabled = "process" in settings.executors.enabled
        return launches and not settings.api_url and enabled


async def _serve(settings: config.Settings, plan: Serving) -> None:
    from corral import runtime

    # The attempt socket is answered once the loops' runtime is up, on its store.
    up: asyncio.Future[client.Client] = asyncio.get_running_loop().create_future()

    async def ready(rt: runtime.Runtime) -> None:
        c = rt.client()
        if not up.done():
            up.set_result(c)
        await _started(c, settings, plan, list(rt.executors))

    attempts = plan.answers_attempts(settings)
    if attempts:
        settings = settings.serving_attempts()

    async def body(stop: asyncio.Event) -> None:
        parts = [_attempts_once_up(settings, up, stop)] if attempts else []
        loops = runtime.serve(
            settings,
            stop,
            dispatch=plan.runs("dispatch"),
            reconcile=plan.runs("reconcile"),
            schedule=plan.runs("schedule"),
            alert=plan.runs("alert"),
            # Bulk operations run beside the API when there is one (serve_http), else here.
            operate=plan.runs("operate") and plan.http is None,
            on_ready=ready,
            kind=plan.kind,
            also_runs=() if plan.http is None else ("api",),
        )
        if plan.http is not None:
            from corral.api.server import serve_http

            parts.append(serve_http(settings, plan.http, stop, pulse=False, sock=plan.sock))
        await (_together(loops, *parts, stop=stop) if parts else loops)

    await until_signalled(body)


async def _started(
    c: client.Client, settings: config.Settings, plan: Serving, executors: list[str]
) -> None:
    """Once the loops are up: the demo's jobs submitted, and what runs said."""
    if plan.demo:
        await _submit_demo(c)
    doing = ", ".join(
        what
        for what, on in (
            ("dispatching", plan.runs("dispatch")),
            ("reconciling", plan.runs("reconcile")),
            ("scheduling", plan.runs("schedule")),
            ("alerting", plan.runs("alert")),
        )
        if on
    )
    err.print(
        f"corral is {doing} on {c.database} with executors: {', '.join(executors)}."
        " Press Ctrl+C (or send SIGTERM) to stop."
    )
    if plan.http is not None:
        await announce(c, plan.http)
    # This process is corral's own, so this is done here, not in runtime.
    collect_from_here()


async def _attempts_once_up(
    settings: config.Settings, up: asyncio.Future[client.Client], stop: asyncio.Event
) -> None:
    """Answer the attempt socket (api.server.serve_attempts) on the loops' client, once
    their runtime is up; nothing if `stop` comes first."""
    stopping = asyncio.ensure_future(stop.wait())
    waiting: set[asyncio.Future[Any]] = {up, stopping}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not up.done():
        return
    from corral.api.server import serve_attempts

    await serve_attempts(settings, stop, c=up.result())


async def announce(c: client.Client, http: str) -> None:
    """Where the API and the dashboard are, on standard error as plain lines (never a log
    record); and on an installation without an all-tenant admin token, one made now and
    shown this once (exactly one, however many corrals start at once)."""
    made = await c.first_admin_token()
    if made is not None:
        token, secret = made
        click.echo(
            f"corral: a first admin token, for every tenant (token {token.id}; shown this once:"
            f" keep it, and `corral tokens revoke {token.id}` once you have made your own):",
            err=True,
        )
        click.echo(secret, err=True)
    click.echo(f"corral: the API: http://{http}/api/v1 (OpenAPI: /api/v1/openapi.json)", err=True)
    click.echo(
        f"corral: the dashboard: http://{http}/ui/ (sign in with a token, or a user of"
        " `corral users add`)",
        err=True,
    )


async def _together(*parts: Awaitable[None], stop: asyncio.Event) -> None:
    """Run `parts` until all end; when one fails, `stop` the others and raise its error."""
    tasks = [asyncio.ensure_future(p) for p in parts]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _submit_demo(c: client.Client) -> None:
    made = 0
    for job in DEMO_JOBS:
        _, created = await c.submit(
            spec={"command": job["command"]},
            idempotency_key=job["key"],
            queue="demo",
            priority=job.get("priority", 0),
            max_attempts=job.get("max_attempts"),
        )
        made += created
    if made:
        err.print(
            f"submitted {made} demo jobs; watch them with `.venv/bin/corral jobs list`"
            " in another terminal"
        )


HEALTH_FILE = click.option(
    "--health-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Note every finished tick and pass in this file, for `corral health`"
    " (default: the health_file setting).",
)


HTTP = click.option(
    "--http",
    "http",
    default=None,
    metavar="HOST:PORT",
    help="Serve the REST API here too, e.g. 127.0.0.1:8080 (tokens: corral tokens create).",
)

METRICS = click.option(
    "--metrics",
    "metrics_at",
    default=None,
    metavar="HOST:PORT",
    help="Serve this process's metrics for Prometheus here (at /metrics, no token),"
    " e.g. 0.0.0.0:9100.",
)


@click.command()
@click.option("--demo", is_flag=True, help="Submit a few demo jobs on first start.")
@HTTP
@METRICS
@HEALTH_FILE
@log_format_option
@config_option
@click.pass_obj
def serve(
    state: State, demo: bool, http: str | None, metrics_at: str | None, health_file: Path | None
) -> None:
    """Run corral: dispatcher, reconciler, scheduler, alerter (with rules), API (with --http).

    The alerter runs when corral.toml has alert rules; the REST API and its /healthz, /readyz
    and /metrics when --http HOST:PORT is given."""
    _run_loops(
        state,
        health_file,
        demo=demo,
        loops=("dispatch", "reconcile", "schedule", "alert", "operate"),
        http=http,
        metrics_at=metrics_at,
    )


@click.command("api")
@click.option("--http", "http", required=True, metavar="HOST:PORT", help="Where to listen.")
@click.option(
    "--workers",
    type=click.IntRange(1, 64),  # more serve no machine better; refuses 400 for 4
    default=1,
    show_default=True,
    help="Processes serving the one socket, each drawing pages beside the others (about"
    " one a core the API may use). A worker that dies stops them all.",
)
@log_format_option
@config_option
@click.pass_obj
def api_cmd(state: State, http: str, workers: int) -> None:
    """Serve the REST API alone (any number of these may run, on any database)."""
    from corral.api.processes import serve_forked
    from corral.api.server import address, listen, serve_http

    try:
        address(http)
    except errors.InvalidInput as exc:
        raise click.BadParameter(str(exc).partition(": ")[2], param_hint="--http") from None
    settings = state.settings()
    setup_logging(settings)
    sock = listen(http)  # bound before anything says it is served (a busy port: exit 2)

    def serve_one(index: int) -> int:
        ready = (lambda c: announce(c, http)) if index == 0 else None
        run(
            until_signalled(
                lambda stop: serve_http(settings, http, stop, sock=sock, on_ready=ready)
            )
        )
        return 0

    if workers == 1:
        serve_one(0)
        return
    if status := serve_forked(workers, serve_one):
        raise SystemExit(status)


@click.command("dispatcher")
@METRICS
@HEALTH_FILE
@log_format_option
@config_option
@click.pass_obj
def dispatcher_cmd(state: State, health_file: Path | None, metrics_at: str | None) -> None:
    """Run the dispatcher loop alone."""
    _run_loops(
        state,
        health_file,
        demo=False,
        loops=("dispatch",),
        metrics_at=metrics_at,
        kind="dispatcher",
    )


@click.command("reconciler")
@METRICS
@HEALTH_FILE
@log_format_option
@config_option
@click.pass_obj
def reconciler_cmd(state: State, health_file: Path | None, metrics_at: str | None) -> None:
    """Run the reconciler loop alone (recovery: adopt, relaunch, complete, time out, lost)."""
    _run_loops(
        state,
        health_file,
        demo=False,
        loops=("reconcile",),
        metrics_at=metrics_at,
        kind="reconciler",
    )


@click.command("scheduler")
@METRICS
@HEALTH_FILE
@log_format_option
@config_option
@click.pass_obj
def scheduler_cmd(state: State, health_file: Path | None, metrics_at: str | None) -> None:
    """Run the scheduler loop alone (fires schedules; any number may run at once)."""
    _run_loops(
        state, health_file, demo=False, loops=("schedule",), metrics_at=metrics_at, kind="scheduler"
    )


@click.command("alerter")
@METRICS
@HEALTH_FILE
@log_format_option
@config_option
@click.pass_obj
def alerter_cmd(state: State, health_file: Path | None, metrics_at: str | None) -> None:
    """Run the alerter alone (reads the run log, sends alerts; any number may run at once)."""
    _run_loops(
        state, health_file, demo=False, loops=("alert",), metrics_at=metrics_at, kind="alerter"
    )


def _run_loops(
    state: State,
    health_file: Path | None,
    *,
    demo: bool,
    loops: tuple[str, ...],
    http: str | None = None,
    metrics_at: str | None = None,
    kind: str = "serve",
) -> None:
    if http is not None:
        _address(http, "--http")
    listen = _address(metrics_at, "--metrics") if metrics_at is not None else None
    settings = state.settings(health_file=health_file)
    setup_logging(settings)
    _refuse_exposed(state, settings)
    sock = None
    if http is not None:  # bound before anything says it is served (a busy port: exit 2)
        from corral.api.server import listen as bind

        sock = bind(http)
    stop_metrics = _serve_metrics(listen) if listen is not None else None
    try:
        run(_serve(settings, Serving(loops, demo=demo, http=http, kind=kind, sock=sock)))
    finally:
        if stop_metrics is not None:
            stop_metrics()


def _refuse_exposed(state: State, settings: config.Settings) -> None:
    """ConfigError when tenants' process jobs run here as other users and could read
    corral's settings or database."""
    if settings.executors.process.strangers and "process" in settings.executors.enabled:
        from corral.cli import exposure

        if exposed := exposure.readable(settings, state.config_file):
            raise errors.ConfigError(
                "; ".join(exposed) + ": tenants' process jobs run on this host as other"
                " users (executors.process), so corral will not start until only it can"
                " read them"
            )


def _address(given: str, option: str) -> tuple[str, int]:
    """HOST:PORT of `option`, or a usage error naming it."""
    from corral.api.server import address

    try:
        return address(given, option=option)
    except errors.InvalidInput as exc:
        raise click.BadParameter(str(exc).partition(": ")[2], param_hint=option) from None


def _serve_metrics(listen: tuple[str, int]) -> Callable[[], None]:
    """Serve corral.metrics at `listen` on a thread of its own; how to stop it."""
    from corral import metrics

    host, port = listen
    try:
        stop = metrics.serve(host, port)
    except OSError as exc:
        raise errors.ConfigError(f"--metrics: could not listen on {host}:{port}: {exc}") from None
    err.print(f"metrics for Prometheus: http://{host}:{port}/metrics")
    return stop


@click.command("health")
@click.option(
    "--file",
    "path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The health file (default: the health_file setting).",
)
@click.option(
    "--max-age",
    default=None,
    help=f"A loop whose last tick or pass ended longer ago than this is stuck, e.g. 90s"
    f" (default {health.DEFAULT_MAX_AGE.total_seconds():g}s; with --ready, no age check).",
)
@click.option(
    "--ready",
    is_flag=True,
    help="Only check that every loop has finished its first tick or pass.",
)
@config_option
@click.pass_obj
def health_cmd(state: State, path: Path | None, max_age: str | None, ready: bool) -> None:
    """Exit 0 when a running corral's loops are alive (its health file is fresh), else 1.

    For liveness and readiness probes: run corral with --health-file PATH (or the
    health_file setting), and check that file here."""
    if path is None:
        path = state.settings(check_chain=False).health_file
    if path is None:
        raise errors.InvalidInput(
            "no health file to check: give --file PATH or set health_file (CORRAL_HEALTH_FILE)"
        )
    from corral import clock

    limit = None if ready else health.DEFAULT_MAX_AGE
    if max_age is not None:
        try:
            limit = durations.parse_duration(max_age)
        except ValueError as exc:
            raise errors.InvalidInput(f"--max-age: {exc}") from None
    said = health.check(path, now=clock.SystemClock().now(), max_age=limit)
    out.print(said, markup=False, soft_wrap=True)
