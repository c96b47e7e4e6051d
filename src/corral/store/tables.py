"""The tables corral keeps: jobs, attempts (whose id is the fence) and the events run log.

The migrations in migrations/versions must build exactly this schema; a test diffs them.
The columns many tables share (their own id, the tenant, the times every row has) are made
by one function each (`id_column`, `tenant_column`, `at`, `made`: columns.py, with the
types and the MetaData), so they are the same everywhere.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)

from corral.store.alert_tables import PENDING as PENDING
from corral.store.alert_tables import alert_cursors as alert_cursors
from corral.store.alert_tables import alert_mutes as alert_mutes
from corral.store.alert_tables import alert_streaks as alert_streaks
from corral.store.alert_tables import alert_tries as alert_tries
from corral.store.alert_tables import alerts as alerts
from corral.store.alert_tables import tenant_alert_channels as tenant_alert_channels
from corral.store.alert_tables import tenant_alert_rules as tenant_alert_rules
from corral.store.columns import Id as Id
from corral.store.columns import Json as Json
from corral.store.columns import UTCDateTime as UTCDateTime
from corral.store.columns import at, id_column, made, tenant_column
from corral.store.columns import metadata as metadata
from corral.store.flow_tables import flow_starts as flow_starts
from corral.store.flow_tables import flows as flows
from corral.store.monitor_tables import monitor_changes as monitor_changes
from corral.store.monitor_tables import monitor_pings as monitor_pings
from corral.store.monitor_tables import monitors as monitors
from corral.store.monitor_tables import monitors_judged as monitors_judged

jobs = Table(
    "jobs",
    metadata,
    id_column(),
    tenant_column(),
    Column("queue", String(200), nullable=False),
    Column("pool", String(200)),
    Column("priority", Integer, nullable=False),
    Column("executor", String(50), nullable=False),
    Column("spec", Json, nullable=False),
    Column("payload", Json),
    Column("state", String(20), nullable=False),
    at("run_at"),
    Column("idempotency_key", String(500)),
    Column("max_attempts", Integer, nullable=False),
    Column("attempt_count", Integer, nullable=False),
    Column("labels", Json, nullable=False),
    *made(),
    Column("policy", Json, nullable=False, server_default=text("'{}'")),
    Column("code_version", Text),
    # Attempts that never reached their platform: they count toward neither max_attempts
    # nor the retry budget (model.End).
    Column("uncharged_attempts", Integer, nullable=False, server_default=text("0")),
    # Made by a tenant (the API, the dashboard, a tenant's schedule): a process job of it
    # runs as a stranger to corral (executors/base.stranger_of).
    Column("tenant_made", Boolean, nullable=False, server_default=false()),
    Column("callback", Text),  # where its result goes (corral.callbacks), as model.Job says
    Column("failure_callback", Text),
    Column("callback_of", Id),
    # The flow it goes through (corral.flows), named within its tenant; NULL: none. Its
    # jobs are claimed apart (store/flow_claims.py), in the partial indexes of indexes.py.
    Column("flow", String(100)),
    # A job list reads the newest jobs of a state (of a queue's state) first and stops at
    # its limit: these hand them over in that order, however few of the table they are.
    Index("ix_jobs_state", "state", "id"),
    Index("ix_jobs_queue_state", "queue", "state", "id"),
    Index("ix_jobs_tenant_state", "tenant", "state", "id"),
)
attempts = Table(
    "attempts",
    metadata,
    id_column(),  # the fence token
    # No foreign key: an attempt is only ever made by the claim, from its job's row, and a
    # foreign key's check costs a lookup per attempt on the hot path.
    Column("job_id", Id, nullable=False),
    Column("attempt_no", Integer, nullable=False),
    Column("launch_name", String(63), nullable=False),  # a function of (job_id, attempt_no)
    Column("executor", String(50), nullable=False),
    Column("state", String(20), nullable=False),
    *made(),
    Column("started_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
    Column("exit_code", Integer),
    Column("reason", Text),
    Column("last_seen_at", UTCDateTime),
    Column("deadline_at", UTCDateTime),
    Column("lease_until", UTCDateTime),
    Column("lease_seconds", Float),  # set for a job that sends heartbeats: its lease length
    Column("failure_class", String(20)),
    Column("fingerprint", String(64)),
    # The loop (loops.id) that recorded a blind attempt running and sent it (an HTTP
    # request): recovery ends it lost once that loop is known dead (store/loops.py).
    Column("sent_by", String(32)),
    UniqueConstraint("job_id", "attempt_no"),
    sqlite_autoincrement=True,  # never reuse an id: a reused fence would unfence a writer
)

# Live attempts (launching or running) by fence: what the dispatcher polls (filtering by
# executor as it reads: live attempts are few) and recovery scans. Only those: a lookup by
# fence never has a reason to read it, and the ended attempts, nearly all of them, are not
# in it.
LIVE = text("state IN ('launching', 'running')")
"""The predicate of ix_attempts_live (indexes.py). A query that reads live attempts says it
as written here (not with bound states): SQLite uses a partial index only for a query whose
WHERE has the index's terms as they are, and PostgreSQL's generic plans can then use it."""

# Running blind attempts that name their sender (ix_attempts_sent_by): said as LIVE is.
SENT = text("state = 'running' AND sent_by IS NOT NULL")
"""The predicate of ix_attempts_sent_by (indexes.py), as its readers write it."""

# One token bucket per queue: retries draw a token each; first attempts (counted by fence,
# from `counted_fence` on) and the passing of time put tokens back. See corral.retry.Budget.
retry_budgets = Table(
    "retry_budgets",
    metadata,
    Column("queue", String(200), primary_key=True),
    Column("tokens", Float, nullable=False),
    at("updated_at"),
    Column("counted_fence", Id, nullable=False),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("job_id", Id, primary_key=True),  # no foreign key: checkpoint_save checks the job
    Column("fence", Id, nullable=False),
    Column("state", Json, nullable=False),
    at("saved_at"),
)

publish_pointers = Table(
    "publish_pointers",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("dataset", String(500), primary_key=True),
    Column("fence", Id, nullable=False),
    Column("location", Text, nullable=False),
    Column("code_version", Text),
    at("published_at"),
)

events = Table(
    "events",
    metadata,
    id_column(),
    Column(
        "job_id", Id, nullable=False
    ),  # no foreign key: events are written with their job's change
    Column("attempt_id", Id),
    Column("entity", String(10), nullable=False),
    Column("from_state", String(20)),
    Column("to_state", String(20), nullable=False),
    Column("reason", Text, nullable=False),
    at("at"),
    Column("details", Json, nullable=False),
    Index("ix_events_job", "job_id", "id"),
    sqlite_autoincrement=True,
)

# Events that moved a job to an end the overview charts, by time (ix_events_job_ends,
# indexes.py): what the charts of throughput and failures count per minute or hour.
JOB_ENDS = text("entity = 'job' AND to_state IN ('succeeded', 'failed', 'quarantined')")
"""The predicate of ix_events_job_ends. A query that counts job ends says it as written
here, as with LIVE."""

# What each attempt left to read (launching.RunLog): written in the transaction that ends the
# attempt, once (the attempt's id is the key), and removed with its job. Its job's tenant and
# its size (`bytes`: the UTF-8 bytes of its streams' text; 0 for a callback job's, which no
# quota counts) make what a tenant keeps one read of ix_run_logs_tenant; one trimmed for its
# tenant's run_log_bytes has no streams left, its facts (latency, status, address) and when
# it was trimmed.
run_logs = Table(
    "run_logs",
    metadata,
    Column("attempt_id", Id, primary_key=True, autoincrement=False),
    Column("job_id", Id, nullable=False),
    at("recorded_at"),
    Column("latency", Float),
    Column("status", Integer),
    Column("address", String(100)),
    Column("streams", Json, nullable=False),
    Column("tenant", String(200), nullable=False, server_default=text("''")),
    Column("bytes", BigInteger, nullable=False, server_default=text("0")),
    Column("trimmed_at", UTCDateTime),
    Index("ix_run_logs_job", "job_id", "attempt_id"),
    Index("ix_run_logs_tenant", "tenant", "bytes"),
)

# A schedule: when (a cron expression in a zone, or an interval from an anchor) and the job
# template each firing submits. The scheduler reads schedules by next_due, through a partial
# index of the ones that are not paused and have not ended (indexes.py): a paused schedule
# costs nothing.
schedules = Table(
    "schedules",
    metadata,
    id_column(),
    tenant_column(),
    Column("name", String(200), nullable=False),
    Column("cron", String(200)),
    Column("tz", String(64), nullable=False),
    Column("every_seconds", BigInteger),
    at("anchor"),
    Column("template", Json, nullable=False),
    Column("catchup", String(10), nullable=False),
    Column("catchup_window_seconds", Float, nullable=False),
    Column("catchup_max", Integer, nullable=False),
    Column("overlap", String(10), nullable=False),
    Column("jitter_seconds", Float, nullable=False),
    Column("until", UTCDateTime),
    Column("paused_at", UTCDateTime),
    Column("next_due", UTCDateTime),
    Column("last_nominal", UTCDateTime),
    Column("last_job_id", Id),
    Column("missed_total", BigInteger, nullable=False),
    *made(),
    # Made or changed by a tenant (the API, the dashboard): its firings check the grant.
    Column("tenant_made", Boolean, nullable=False, server_default=false()),
    # Paused after this many failed firings in a row (NULL: its tenant's default; 0: never),
    # why it is paused (NULL: by hand), and since when its firings count (its last resume).
    Column("pause_after", Integer),
    Column("paused_reason", Text),
    Column("counted_from", UTCDateTime),
    # Made or changed by `corral apply`: `apply --prune` deletes only these (0035).
    Column("managed", Boolean, nullable=False, server_default=false()),
    UniqueConstraint("tenant", "name"),
    sqlite_autoincrement=True,  # a schedule made again under a deleted one's name is new
)
DUE = text("paused_at IS NULL AND next_due IS NOT NULL")
"""The predicate of ix_schedules_due (indexes.py), as its readers write it."""

# One row per nominal time of a schedule that was recorded: fired, backfilled, missed,
# skipped while paused, or skipped for overlap. The unique key is the scheduler's fence.
# Kept as long as the schedule is, whatever the retention of jobs.
firings = Table(
    "firings",
    metadata,
    Column("schedule_id", Id, nullable=False),
    at("nominal_at"),
    Column("outcome", String(20), nullable=False),
    Column("job_id", Id),
    at("recorded_at"),
    Column("lateness_seconds", Float, nullable=False),
    Column("note", Text),
    UniqueConstraint("schedule_id", "nominal_at"),
)

# What each closed hour of a schedule's firings came to (store/firing_stats.py, the sums of
# corral.firing_stats.Tally): its firings by outcome, their jobs that succeeded, failed (or
# wait in quarantine) or were cancelled, and the response times of those that ended. An
# hour is closed once every job of it has ended (or it lies SETTLE_LIMIT in the past): a
# schedule's stats read these rows and count only the open hours from the firings. Hours
# with no firing have no row. Deleted with the schedule.
firing_hours = Table(
    "firing_hours",
    metadata,
    Column("schedule_id", Id, primary_key=True, autoincrement=False),
    Column("hour", UTCDateTime, primary_key=True),
    *(
        Column(name, Integer, nullable=False)
        for name in (
            "fired",
            "missed",
            "skipped",
            "overlap",
            "refused",
            "backfilled",
            "succeeded",
            "failed",
            "cancelled",
            "latency_count",
        )
    ),
    Column("latency_sum", Float, nullable=False),
    Column("latency_max", Float),
)

# How far each schedule's hours are closed: every hour before `counted_until` that had a
# firing has its firing_hours row (None: none is counted yet). `version` grows with every
# change, so one that counted from an older read writes nothing (compare-and-set); a firing
# recorded late into a past hour (catch-up, resume, backfill) reopens that hour.
firing_rollups = Table(
    "firing_rollups",
    metadata,
    Column("schedule_id", Id, primary_key=True, autoincrement=False),
    Column("counted_until", UTCDateTime),
    Column("version", BigInteger, nullable=False),
)

signing_secrets = Table(
    "signing_secrets",
    metadata,
    id_column(),
    tenant_column(),
    Column("secret", String(200), nullable=False),
    at("created_at"),
    Column("retires_at", UTCDateTime),
    Index("ix_signing_secrets_tenant", "tenant", "id"),
    # uq_signing_secrets_current, a partial index: indexes.py
    sqlite_autoincrement=True,
)

# A job's SLA (its policy's `sla`): when it must have succeeded by. The reconciler reads
# the rows that are due, notes a miss in the job's run log, and removes them.
job_slas = Table(
    "job_slas",
    metadata,
    Column("job_id", Id, primary_key=True, autoincrement=False),
    at("due_at"),
    Index("ix_job_slas_due_at", "due_at"),
)

# API credentials (corral.api): the SHA-256 of each secret, never the secret; a token acts
# for one tenant (NULL: every tenant, an admin's) in one role.
tokens = Table(
    "tokens",
    metadata,
    id_column(),
    Column("name", String(200), nullable=False),
    tenant_column(nullable=True),
    Column("role", String(20), nullable=False),
    Column("secret_sha256", String(64), nullable=False, unique=True),
    at("created_at"),
    Column("expires_at", UTCDateTime),
    Column("revoked_at", UTCDateTime),
    sqlite_autoincrement=True,
)

# Every change made through the API: by which token, for which tenant, what, to what.
audit = Table(
    "audit",
    metadata,
    id_column(),
    at("at"),
    Column("token_id", Id),
    tenant_column(nullable=True),
    Column("action", String(100), nullable=False),
    Column("target", String(300), nullable=False),
    Column("details", Json, nullable=False),
    Index("ix_audit_tenant", "tenant", "id"),
    sqlite_autoincrement=True,
)

# Secrets corral's own processes share by name (`attempts`: the key of attempt tokens),
# made by the first process that needs one.
service_keys = Table(
    "service_keys",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("secret", String(200), nullable=False),
    at("created_at"),
)

# Bulk operations (retry, cancel, discard by filter): each runs on the snapshot of ids its
# preview showed, one item a job, marked when done, so a restart goes on where it stopped.
operations = Table(
    "operations",
    metadata,
    id_column(),
    tenant_column(nullable=True),
    Column("action", String(20), nullable=False),
    Column("filter", Json, nullable=False),
    Column("state", String(20), nullable=False),
    Column("total", Integer, nullable=False),
    Column("applied", Integer, nullable=False, server_default="0"),
    Column("skipped", Integer, nullable=False, server_default="0"),
    Column("token_id", Id),
    Column("made_by", String(200), nullable=False),
    *made(),
    Column("finished_at", UTCDateTime),
    Index("ix_operations_state", "state", "id"),
    sqlite_autoincrement=True,
)

operation_items = Table(
    "operation_items",
    metadata,
    Column(
        "operation_id",
        Id,
        ForeignKey("operations.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("job_id", Id, primary_key=True),
    Column("outcome", String(20)),
    Column("note", String(300)),
    Column("done_at", UTCDateTime),
    # ix_operation_items_todo, a partial index: indexes.py
)

# People who sign in to the dashboard (an argon2 hash of the password, never the password),
# for one tenant or every tenant in one role, as tokens are; and signed-in browsers.
users = Table(
    "users",
    metadata,
    id_column(),
    Column("name", String(200), nullable=False, unique=True),
    Column("password_hash", String(300), nullable=False),
    tenant_column(nullable=True),
    Column("role", String(20), nullable=False),
    at("created_at"),
    Column("removed_at", UTCDateTime),
    sqlite_autoincrement=True,
)

web_sessions = Table(
    "web_sessions",
    metadata,
    Column("secret_sha256", String(64), primary_key=True),
    Column("user_id", Id),
    Column("token_id", Id),
    Column("csrf", String(64), nullable=False),
    at("created_at"),
    at("expires_at"),
    Index("ix_web_sessions_expires_at", "expires_at"),
)

# `corral worker` processes (corral.worker): one row each, kept after it stops (which app
# version read which payload version), and the (task, payload version) pairs each reads.
workers = Table(
    "workers",
    metadata,
    Column("id", String(100), primary_key=True),
    Column("app", String(200), nullable=False),
    Column("app_version", String(100), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("queues", Json, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("state", String(20), nullable=False),  # model.WorkerState
    at("started_at"),
    at("last_seen_at"),
    Column("stopped_at", UTCDateTime),
)
worker_tasks = Table(
    "worker_tasks",
    metadata,
    Column("worker_id", String(100), primary_key=True),
    Column("task", String(200), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("newest", Boolean, nullable=False),  # the version this worker writes
    Column("schema", Json, nullable=False),  # the version's JSON Schema
    Index("ix_worker_tasks_task_version", "task", "version"),
)

# The installation's id (one row, made by migration 0021): the label value that keeps two
# corral installations' objects apart on a cluster they share.
installation = Table(
    "installation",
    metadata,
    Column("id", String(63), primary_key=True),
)

# corral's long-running processes (serve, dispatcher, ..., worker, api): one row each, beaten
# every heartbeat_interval, forgotten a day after its last beat (store/loops.py).
loops = Table(
    "loops",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("kind", String(20), nullable=False),  # the command: serve, dispatcher, ...
    Column("runs", Json, nullable=False),  # the loops it runs: dispatcher, scheduler, ...
    Column("executors", Json, nullable=False),  # the executors it dispatches
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("pid_started", String(40)),  # "<pid namespace>:<start time>", where known
    Column("version", String(50), nullable=False),
    at("started_at"),
    at("beat_at"),
    Column("stopped_at", UTCDateTime),
)

# Each time a condition of work nobody can do begins, a row, until it ends: at most one open
# row a condition (uq_loop_warnings_open, indexes.py), so it is said once.
loop_warnings = Table(
    "loop_warnings",
    metadata,
    id_column(),
    Column("condition", String(40), nullable=False),
    Column("message", Text, nullable=False),
    at("begun_at"),
    at("checked_at"),
    Column("ended_at", UTCDateTime),
)

# Each tenant's place in the fair share of claims (store/shares.py): `turn` is how far its
# turns have gone (each job claimed adds 1 / its weight); `clock` the turn the last claim
# that served it reached. A tenant that comes back after a pause starts from the newest
# clock of the tenants waiting with it, not from where it left off, so it gets its share
# and no more. No column but the key is indexed: a claim's update of a row stays on its
# page and writes no index entry.
tenant_shares = Table(
    "tenant_shares",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("turn", Float, nullable=False),
    Column("clock", Float, nullable=False),
)

# Each tenant's submit_rate as a token bucket: `tokens` left at `filled_at`, refilled at the
# tenant's rate up to one minute's worth. Kept in the store, so every API replica takes from
# the same bucket.
tenant_buckets = Table(
    "tenant_buckets",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("tokens", Float, nullable=False),
    at("filled_at"),
)
