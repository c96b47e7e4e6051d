"""What corral's loops count and time, for Prometheus (prometheus_client's registry).

The loops (dispatcher, reconciler, scheduler, alerter) record into the metrics here; the
API serves them at /metrics with what it reads from the store at scrape time (jobs by
state and queue, retry budget tokens: corral.api.metrics), and a process that runs loops
but no API serves them itself (`--metrics HOST:PORT`, `serve`).

Labels are few and bounded: queue, executor, kind, state, channel kind, outcome; never a
job, attempt or schedule id. Times are measured on the loops' injected Clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

import prometheus_client
from prometheus_client import Counter, Histogram

from corral import clock

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds, for a store round trip: from a millisecond to the transaction backstop."""
LATENESS_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""Seconds a firing came after its nominal time: from on time to an hour's outage."""

CLAIM = Histogram(
    "corral_claim_duration_seconds",
    "Time one claim transaction of the dispatcher took (pick due jobs, write their attempts).",
    buckets=LATENCY_BUCKETS,
)
SETTLE = Histogram(
    "corral_settle_duration_seconds",
    "Time one write of the dispatcher took: `settle` records launched attempts running with"
    " the completions that arrived meanwhile; `finish` writes completions alone.",
    ["write"],
    buckets=LATENCY_BUCKETS,
)
TICK = Histogram(
    "corral_tick_duration_seconds",
    "Time one dispatcher tick took: claim, launch, record.",
    buckets=(*LATENCY_BUCKETS, 30.0, 60.0),
)
LAUNCH_ERRORS = Counter(
    "corral_launch_errors_total",
    "Launches that failed (the attempt is left for recovery), by executor.",
    ["executor"],
)
COMPLETIONS = Counter(
    "corral_completions_total",
    "Completions the dispatcher wrote, by the attempt's end and the job's state after it"
    " (queued: retried later).",
    ["attempt_state", "job_state"],
)
REPAIRS = Counter(
    "corral_repairs_total",
    "What the reconciler did, by kind (adopted, relaunched, completed, timed_out, lost, ...).",
    ["kind"],
)
LATENESS = Histogram(
    "corral_schedule_lateness_seconds",
    "How long after its nominal time a schedule fired (0 for one fired ahead, whose job"
    " waits for its time).",
    buckets=LATENESS_BUCKETS,
)
ALERT_DELIVERIES = Counter(
    "corral_alert_deliveries_total",
    "Tries to deliver an alert, by channel kind (email, slack, webhook) and outcome"
    " (delivered, failed: tried again later, given_up: no tries left).",
    ["channel", "outcome"],
)

NOT_REPAIRS = frozenset({"looked", "waiting"})
"""Fields of a reconciler pass's summary that count what it saw, not what it did."""


@contextlib.contextmanager
def timed(histogram: Histogram, on: clock.Clock) -> Iterator[None]:
    """Observe in `histogram` how long the block took on the clock `on` (failed or not)."""
    began = on.monotonic()
    try:
        yield
    finally:
        histogram.observe(max(on.monotonic() - began, 0.0))


def repairs(done: Mapping[str, int]) -> None:
    """Count a reconciler pass's repairs, by kind (its summary's fields)."""
    for kind, count in done.items():
        if count and kind not in NOT_REPAIRS:
            REPAIRS.labels(kind=kind).inc(count)


def exposition() -> tuple[bytes, str]:
    """The registry in Prometheus' text format, and its content type."""
    return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST


def serve(host: str, port: int) -> Callable[[], None]:
    """Serve the registry at http://host:port/metrics on a daemon thread; returns how to
    stop it. OSError when the address cannot be listened on."""
    server, thread = prometheus_client.start_http_server(port, addr=host)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
