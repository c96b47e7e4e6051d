"""The REST API's job list and job page over a large store, against the same page's bare SQL.

    .venv/bin/python bench/api.py [--jobs 1000000] [--events 5000000] [--clients 8]
                                  [--requests 200] [--pg-url URL] [--http-client plain]
                                  [--api-processes 1]

On a fresh PostgreSQL database, migrated by corral and dropped afterwards:
  * `--jobs` jobs and `--events` events are loaded with INSERT ... SELECT over
    generate_series (not timed): states, queues, tenants, labels and times spread as a
    busy installation has them, an attempt for every job that has run;
  * `corral api --http` serves the real app in one process of its own (nothing
    dispatches; `--api-processes N`: N processes, the clients spread evenly over them,
    `api_server` their sums), and `--clients` clients, each `--requests` requests on one
    HTTP/1.1 connection kept alive, ask with an admin token for a mix of pages:
    GET /api/v1/jobs by state only, by state and queue, by a label, and
    GET /api/v1/jobs/{id} (the job page: the job, its attempts, its events, its run
    logs). A request is timed from its first byte written to its answer's last byte read
    (status checked, body not parsed);
  * the same pages' bare SQL, the statements the store runs for each (taken from the store
    as it runs them: `Capture`; on PostgreSQL the text and parameters it hands psycopg on
    its reads' own connections), replayed on `--clients` plain psycopg connections at the
    same concurrency, each statement one round trip, rows fetched; the token lookup of a
    request is not in it.
Both run over the same request list, after a warm-up of each, so both read warm pages.
Each client sends its next request as soon as it has the answer to the last, so a page's
time is mostly its wait behind the other clients' requests: the ratio is one of how many
requests a second each side serves (`api_server` says what the API process spent).

Both sides' clients run in this one process, on the same cores as the API process and the
database server, so what a client spends per request is taken from what it measures. The
API side's clients are `PlainClient`s: a request written as bytes, its answer read by its
Content-Length, about as little per request as psycopg spends on a statement on the bare
side. `--http-client httpx` times the same requests with httpx's AsyncClient instead, which
spends about as much CPU per request as the API process itself (docs/performance.md).

JSON on stdout: p50/p95 in ms of each page, API and bare, the ratio of their p95s, and
whether each page meets the targets (p95 at most 2x the bare SQL's, and under 100 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import psycopg
from sqlalchemy import create_engine, event, make_url, text

from corral import config, model, runtime, store

DEFAULT_PG = os.environ.get(
    "CORRAL_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MAX_RATIO = 2.0
"""The target: an API page's p95 at most this many times its bare SQL's."""
MAX_P95_MS = 100.0
"""The target: an API page's p95 under this."""

# The spread of the loaded jobs: (state, per mille), queues and labels.
STATES = [
    ("succeeded", 780),
    ("failed", 50),
    ("queued", 70),
    ("running", 30),
    ("scheduled", 30),
    ("cancelled", 25),
    ("quarantined", 10),
    ("parked", 5),
]
QUEUES = 20  # queue-0 the busiest: a job's queue is skewed towards the low numbers
TENANTS = 10
TEAMS = 50  # label team=team-N, each 2% of jobs
RELEASES = 5000  # label release=rN on one job in 20: each on about 10 jobs a million

# The request mix, each entry (kind, weight).
KINDS = [("state", 3), ("state_queue", 3), ("label", 2), ("job", 4)]


# --- the database --------------------------------------------------------------------------


def admin(pg_admin: str, sql: str) -> None:
    engine = create_engine(pg_admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(sql))
    engine.dispose()


def libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _state_case(column: str) -> str:
    """SQL: the state of a job of bucket `column` (0..999), by STATES."""
    parts, upto = [], 0
    for state, share in STATES:
        upto += share
        parts.append(f"WHEN {column} < {upto} THEN '{state}'")
    return f"CASE {' '.join(parts)} END"


def load(url: str, jobs: int, events: int) -> None:
    """Fill the migrated database at `url`: `jobs` jobs (ids 1..jobs, created one a second
    up to now), an attempt for each that has run, and `events` events spread evenly, one a
    second up to now, a job's last one into its state (so the job ends of a recent window
    are as many as a busy installation's)."""
    jobs_sql = f"""
        INSERT INTO jobs (id, tenant, queue, pool, priority, executor, spec, payload, state,
            run_at, idempotency_key, max_attempts, attempt_count, labels, created_at,
            updated_at)
        SELECT i, 'tenant-' || ((i * 7) % 1009 % {TENANTS}),
            'queue-' || floor({QUEUES} * power(((i * 7907) % 997) / 997.0, 2))::int,
            NULL, (i % 3), 'process', '{{"command": ["true"]}}'::jsonb, NULL, s.state,
            t.created + CASE WHEN s.state = 'scheduled' THEN interval '1 day' ELSE '0' END,
            NULL, 3, CASE WHEN s.state IN ('queued', 'scheduled') THEN 0 ELSE 1 END,
            jsonb_build_object('team', 'team-' || ((i * 31) % 1013 % {TEAMS}),
                               'env', CASE WHEN i % 1019 % 4 = 0 THEN 'staging' ELSE 'prod' END)
              || CASE WHEN i % 20 = 0
                 THEN jsonb_build_object('release', 'r' || ((i / 20) % {RELEASES}))
                 ELSE '{{}}'::jsonb END,
            t.created, t.created
        FROM generate_series(1::bigint, {jobs}) AS i,
            LATERAL (SELECT {_state_case("((i * 7919) % 1000)")} AS state) AS s,
            LATERAL (SELECT now() - make_interval(secs => {jobs} - i) AS created) AS t
    """
    attempts_sql = """
        INSERT INTO attempts (job_id, attempt_no, launch_name, executor, state, created_at,
            updated_at, started_at, finished_at, exit_code)
        SELECT id, 1, 'corral-' || id || '-1', 'process',
            CASE state WHEN 'succeeded' THEN 'succeeded' WHEN 'running' THEN 'running'
                WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END,
            created_at, updated_at, created_at, CASE WHEN state = 'running' THEN NULL
                ELSE created_at + interval '1 second' END,
            CASE state WHEN 'succeeded' THEN 0 WHEN 'running' THEN NULL ELSE 1 END
        FROM jobs WHERE attempt_count > 0 ORDER BY id
    """
    per_job = max(1, events // max(1, jobs))
    events_sql = f"""
        INSERT INTO events (job_id, attempt_id, entity, from_state, to_state, reason, at,
            details)
        SELECT j, NULL, 'job', NULL,
            CASE WHEN e % {per_job} = 0 THEN {_state_case("((j * 7919) % 1000)")}
                ELSE 'queued' END,
            'bench', now() - make_interval(secs => {events} - e), '{{}}'::jsonb
        FROM generate_series(1::bigint, {events}) AS e,
            LATERAL (SELECT 1 + (e - 1) / {per_job} AS j) AS owner
    """
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        conn.execute(jobs_sql)
        conn.execute(f"SELECT setval(pg_get_serial_sequence('jobs', 'id'), {max(1, jobs)})")
        conn.execute(attempts_sql)
        conn.execute(events_sql)
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE attempts")
        conn.execute("VACUUM ANALYZE events")


@contextlib.contextmanager
def loaded(
    pg_url: str, bench: str, jobs: int, events: int, fill: Callable[[str], None] | None = None
) -> Iterator[tuple[str, float]]:
    """A fresh database on `pg_url`'s server, migrated and loaded (`load`, or `fill(url)`
    when given: bench/dashboard_load.py's), dropped after: its URL and the seconds the
    load took."""
    name = f"corral_bench_{bench}_{uuid.uuid4().hex[:8]}"
    admin(pg_url, f'CREATE DATABASE "{name}"')
    url = make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    try:
        db = store.Store.connect(url)
        asyncio.run(db.database.migrate())
        asyncio.run(db.close())
        t0 = time.monotonic()
        if fill is None:
            load(url, jobs, events)
        else:
            fill(url)
        yield url, round(time.monotonic() - t0, 1)
    finally:
        admin(pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the requests ------------------------------------------------------------------------------


def requests(rng: random.Random, count: int, jobs: int) -> list[tuple[str, dict[str, Any]]]:
    """`count` requests of the mix: (kind, the store's arguments for it)."""
    kinds = [k for k, _ in KINDS]
    weights = [w for _, w in KINDS]
    states = [s for s, _ in STATES]
    shares = [w for _, w in STATES]
    out: list[tuple[str, dict[str, Any]]] = []
    for kind in rng.choices(kinds, weights, k=count):
        if kind == "job":
            out.append((kind, {"job_id": rng.randint(1, jobs)}))
        elif kind == "state":
            out.append((kind, {"states": [rng.choices(states, shares)[0]]}))
        elif kind == "state_queue":
            queue = f"queue-{min(QUEUES - 1, int(QUEUES * rng.random() ** 2))}"
            out.append((kind, {"states": [rng.choice(states[:4])], "queue": queue}))
        elif rng.random() < 0.75:
            out.append((kind, {"labels": {"team": f"team-{rng.randrange(TEAMS)}"}}))
        else:
            out.append((kind, {"labels": {"release": f"r{rng.randrange(RELEASES)}"}}))
    return out


def path_of(kind: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The API's path and query for a request."""
    if kind == "job":
        return f"/api/v1/jobs/{args['job_id']}", {}
    query: dict[str, Any] = {}
    if "states" in args:
        query["state"] = args["states"]
    if "queue" in args:
        query["queue"] = args["queue"]
    if "labels" in args:
        query["label"] = [f"{k}={v}" for k, v in args["labels"].items()]
    return "/api/v1/jobs", query


Statement = tuple[str, dict[str, Any]]


class _Recorded:
    """A psycopg connection whose statements are noted as they are sent."""

    def __init__(self, conn: Any, seen: list[Statement]) -> None:
        self.conn = conn
        self.seen = seen

    async def execute(self, sql: str, params: Any = None, **kwargs: Any) -> Any:
        self.seen.append((sql, dict(params or {})))
        return await self.conn.execute(sql, params, **kwargs)


class Capture:
    """The statements the store runs for each page, as it runs them (on PostgreSQL the
    text and parameters it gives psycopg on its reads' own connections, store/hotreads.py;
    SQLAlchemy's compiled SQL for anything read through it), read once per distinct page:
    a job page's statements are the same for every job but its id."""

    def __init__(self, db: store.Store) -> None:
        self.db = db
        self.seen: list[Statement] = []
        self._lists: dict[str, list[Statement]] = {}
        self._job: tuple[int, list[Statement]] | None = None
        event.listen(db.database.engine, "before_cursor_execute", self._record)
        if db.database.read_pool is not None:
            run = db.database.read_pool.run

            async def recorded(fn: Callable[[Any], Awaitable[Any]], **kwargs: Any) -> Any:
                return await run(lambda conn: fn(_Recorded(conn, self.seen)), **kwargs)

            db.database.read_pool.run = recorded  # type: ignore[method-assign]

    def _record(self, conn: Any, cursor: Any, sql: str, params: Any, *_: Any) -> None:
        self.seen.append((sql, dict(params or {})))

    async def _run(self, call: Callable[[], Awaitable[Any]]) -> list[Statement]:
        self.seen = []
        await call()
        # What the store sends around them (the session's limits, BEGIN) is not the page.
        return [(s, p) for s, p in self.seen if s.lstrip().upper().startswith("SELECT")]

    async def statements(self, kind: str, args: dict[str, Any]) -> list[Statement]:
        if kind != "job":
            key = json.dumps(args, sort_keys=True)
            if key not in self._lists:
                self._lists[key] = await self._run(
                    lambda: self.db.jobs.page(model.JobFilter(tenant=None, **args), limit=100)
                )
            return self._lists[key]
        if self._job is None:
            job_id = args["job_id"]

            self._job = (job_id, await self._run(lambda: self.db.jobs.record(job_id=job_id)))
        was, taken = self._job
        return [(s, {k: args["job_id"] if v == was else v for k, v in p.items()}) for s, p in taken]


# --- timing ------------------------------------------------------------------------------------


async def run_clients(
    n: int, work: list[list[Any]], one: Callable[[int, Any], Awaitable[None]]
) -> list[float]:
    """Run each client's list of requests, the clients at once: each request's ms."""
    times: list[list[float]] = [[] for _ in range(n)]

    async def client(i: int) -> None:
        for item in work[i]:
            t0 = time.perf_counter()
            await one(i, item)
            times[i].append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(client(i) for i in range(n)))
    return [t for ts in times for t in ts]


class PlainClient:
    """One HTTP/1.1 connection kept alive, on asyncio's streams: a GET written as bytes and
    its answer read whole, by its Content-Length, with nothing parsed but the status and
    that length. httpx parses and builds far more per request (headers, URLs, its models),
    all of it on the machine's two cores beside the API process and the database, where
    the bare side's psycopg does nothing of the kind."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, base: str) -> PlainClient:
        url = httpx.URL(base)
        reader, writer = await asyncio.open_connection(url.host, url.port)
        return cls(reader, writer)

    async def get(self, target: str, head: bytes) -> tuple[int, bytes]:
        """The status and body of GET `target`, with `head` (the request's header lines)."""
        self.writer.write(b"GET " + target.encode() + b" HTTP/1.1\r\n" + head + b"\r\n")
        said = (await self.reader.readuntil(b"\r\n\r\n")).lower()
        at = said.find(b"\r\ncontent-length:")
        if at < 0:
            raise RuntimeError(f"GET {target}: an answer without a Content-Length: {said!r}")
        length = int(said[at + 17 : said.index(b"\r\n", at + 2)])
        return int(said[9:12]), await self.reader.readexactly(length)

    async def aclose(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def time_api(
    bases: list[str], secret: str, work: list[list[tuple[str, dict[str, Any]]]], plain: bool = True
) -> dict[str, list[float]]:
    """Each client's requests of `work`, timed from the request's first byte sent to the
    answer's last byte read: on a PlainClient each, or (not `plain`) an httpx client each;
    client i asks the server at bases[i % len(bases)]."""
    if not plain:
        return await time_api_httpx(bases, secret, work)
    heads = [
        f"Host: {httpx.URL(b).netloc.decode()}\r\nAuthorization: Bearer {secret}\r\n" for b in bases
    ]
    clients = [await PlainClient.open(bases[i % len(bases)]) for i in range(len(work))]
    by_kind: dict[str, list[float]] = {}
    try:

        async def one(i: int, request: tuple[str, dict[str, Any]]) -> None:
            kind, args = request
            path, query = path_of(kind, args)
            target = f"{path}?{urlencode(query, doseq=True)}" if query else path
            t0 = time.perf_counter()
            status, body = await clients[i].get(target, heads[i % len(heads)].encode())
            by_kind.setdefault(kind, []).append((time.perf_counter() - t0) * 1000)
            if status != 200:
                raise RuntimeError(f"GET {target}: {status} {body[:300]!r}")

        await run_clients(len(work), work, one)
    finally:
        for c in clients:
            await c.aclose()
    return by_kind


async def time_api_httpx(
    bases: list[str], secret: str, work: list[list[tuple[str, dict[str, Any]]]]
) -> dict[str, list[float]]:
    headers = {"Authorization": f"Bearer {secret}"}
    clients = [
        httpx.AsyncClient(base_url=bases[i % len(bases)], headers=headers, timeout=60)
        for i in range(len(work))
    ]
    by_kind: dict[str, list[float]] = {}
    try:

        async def one(i: int, request: tuple[str, dict[str, Any]]) -> None:
            kind, args = request
            path, query = path_of(kind, args)
            t0 = time.perf_counter()
            got = await clients[i].get(path, params=query)
            by_kind.setdefault(kind, []).append((time.perf_counter() - t0) * 1000)
            if got.status_code != 200:
                raise RuntimeError(f"GET {got.url}: {got.status_code} {got.text[:300]}")

        await run_clients(len(work), work, one)
    finally:
        for c in clients:
            await c.aclose()
    return by_kind


async def time_bare(
    dsn: str, work: list[list[tuple[str, list[Statement]]]]
) -> dict[str, list[float]]:
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in work]
    by_kind: dict[str, list[float]] = {}
    try:

        async def one(i: int, request: tuple[str, list[Statement]]) -> None:
            kind, statements = request
            t0 = time.perf_counter()
            for sql, params in statements:
                cur = await conns[i].execute(sql, params)
                await cur.fetchall()
            by_kind.setdefault(kind, []).append((time.perf_counter() - t0) * 1000)

        await run_clients(len(work), work, one)
    finally:
        for c in conns:
            await c.close()
    return by_kind


def quantile(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def summary(api: dict[str, list[float]], bare: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, _ in KINDS:
        if kind not in api:
            continue
        a, b = api[kind], bare[kind]
        p95_api, p95_bare = quantile(a, 0.95), quantile(b, 0.95)
        ratio = p95_api / p95_bare
        out[kind] = {
            "requests": len(a),
            "api_ms": {"p50": round(quantile(a, 0.5), 2), "p95": round(p95_api, 2)},
            "bare_sql_ms": {"p50": round(quantile(b, 0.5), 2), "p95": round(p95_bare, 2)},
            "ratio_p95_api_vs_bare": round(ratio, 2),
            "meets_target": ratio <= MAX_RATIO and p95_api < MAX_P95_MS,
        }
    return out


# --- the server --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve(url: str, scratch: Path, workers: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    """`corral api --http` (with `--workers`) on a free port of 127.0.0.1: the process and
    its base URL."""
    http = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "CORRAL_DATABASE_URL": url, "CORRAL_LOG_LEVEL": "WARNING"}
    log = (scratch / "api.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "api", "--http", http, "--workers", str(workers)],
        env=env,
        stdout=log,
        stderr=log,
        cwd=scratch,
    )
    base = f"http://{http}"
    until = time.monotonic() + 60
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise RuntimeError(f"corral api exited with {proc.returncode}: see api.log")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("corral api did not answer in 60 s")


def cpu_s(pid: int) -> float:
    """The CPU time (user and system) process `pid` and its live children (the workers of
    `corral api --workers`) have used, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children.update(int(c) for c in (task / "children").read_text().split())
    return own + sum(cpu_s(child) for child in children)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- the run ---------------------------------------------------------------------------------


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    plain = args.http_client == "plain"
    settings = config.Settings(database_url=url)
    async with runtime.connect(settings, platforms=False) as c:
        _, secret = await c.token_create(name="bench", tenant=None, role="viewer")
    rng = random.Random(args.seed)
    per = [requests(rng, args.requests, args.jobs) for _ in range(args.clients)]
    warm = [requests(rng, max(5, args.requests // 10), args.jobs) for _ in range(args.clients)]
    db = store.Store.connect(url)
    capture = Capture(db)
    try:
        bare_per = [[(k, await capture.statements(k, a)) for k, a in reqs] for reqs in per]
        bare_warm = [[(k, await capture.statements(k, a)) for k, a in reqs] for reqs in warm]
    finally:
        await db.close()
    with tempfile.TemporaryDirectory(prefix="corral-bench-api-") as scratch:
        served = [serve(url, Path(scratch)) for _ in range(args.api_processes)]
        procs, bases = [p for p, _ in served], [b for _, b in served]
        try:
            await time_api(bases, secret, warm, plain)
            await time_bare(libpq_url(url), bare_warm)
            cpu = sum(cpu_s(p.pid) for p in procs)
            t0 = time.monotonic()
            api = await time_api(bases, secret, per, plain)
            api_wall, cpu = time.monotonic() - t0, sum(cpu_s(p.pid) for p in procs) - cpu
            bare = await time_bare(libpq_url(url), bare_per)
        finally:
            for proc in procs:
                stop(proc)
    pages = summary(api, bare)
    return {
        "jobs": args.jobs,
        "events": args.events,
        "clients": args.clients,
        "http_client": args.http_client,
        "api_processes": args.api_processes,
        "requests_per_client": args.requests,
        "pages": pages,
        "api_server": {
            "requests_per_s": round(args.clients * args.requests / api_wall, 1),
            "cpu_ms_per_request": round(cpu * 1000 / (args.clients * args.requests), 2),
            "cpu_share_of_one_core": round(cpu / api_wall, 2),  # all its processes'
        },
        "targets": {"ratio_p95_api_vs_bare": MAX_RATIO, "api_p95_ms_under": MAX_P95_MS},
        "meets_targets": all(p["meets_target"] for p in pages.values()),
    }


def options(doc: str) -> argparse.ArgumentParser:
    """The options of a benchmark of pages over a loaded store (this one's and
    bench/dashboard.py's): the load's scale, the clients, the server to make databases on."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs loaded")
    parser.add_argument("--events", type=int, default=5_000_000, help="events loaded")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=200, help="timed requests per client")
    parser.add_argument("--pg-url", default=DEFAULT_PG, help="a database to make others from")
    return parser


def main() -> None:
    parser = options(__doc__)
    parser.add_argument("--seed", type=int, default=1, help="of the request mix")
    parser.add_argument(
        "--http-client",
        choices=["plain", "httpx"],
        default="plain",
        help="the API side's clients: PlainClient (default) or httpx's AsyncClient",
    )
    parser.add_argument(
        "--api-processes",
        type=int,
        default=1,
        help="`corral api` processes, the clients spread evenly over them (default 1)",
    )
    args = parser.parse_args()
    if args.jobs < 1 or args.events < 0:
        parser.error("--jobs must be at least 1 and --events not negative")
    with loaded(args.pg_url, "api", args.jobs, args.events) as (url, load_s):
        report = asyncio.run(measure(url, args))
    report["load_s"] = load_s
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
