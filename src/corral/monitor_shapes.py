"""Monitors as JSON, once for the API, `--json` of the CLI and the dashboard: a monitor with
its ping URL, its pings and its history. Beside corral.shapes, which is as long as a module
may be."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral import durations, monitoring

if TYPE_CHECKING:  # the store's values, as the type checker sees them: a command imports no SQL
    from corral import store


def _iso(at: Any) -> str | None:
    return None if at is None else str(at.isoformat())


def monitor_dict(monitor: monitoring.Monitor, ping_url: str | None) -> dict[str, Any]:
    """A monitor: what it expects, where it stands, and its ping URL (None while
    public_url is not set)."""
    return {
        "name": monitor.name,
        "tenant": monitor.tenant,
        "state": monitor.state,
        "state_since": _iso(monitor.state_at),
        "period": None if monitor.period is None else durations.format_duration(monitor.period),
        "cron": monitor.cron,
        "tz": monitor.tz if monitor.cron is not None else None,
        "grace": durations.format_duration(monitor.grace),
        "ping_url": ping_url,
        "last_ping_at": _iso(monitor.last_ping_at),
        "expected_at": _iso(monitor.expected_at),
        "down_at": _iso(monitor.down_at),
        "run_started_at": _iso(monitor.run_started_at),
        "alert_rule": monitor.rule,
        "created_at": _iso(monitor.created_at),
    }


def ping_dict(ping: store.monitor_pings.Ping) -> dict[str, Any]:
    """One ping a monitor recorded."""
    return {
        "at": _iso(ping.at),
        "kind": ping.kind,
        "exit_code": ping.exit_code,
        "source": ping.source,
        "user_agent": ping.user_agent,
        "body": ping.body,
        "duration_seconds": ping.duration_seconds,
    }


def change_dict(change: store.monitors.StateChange) -> dict[str, Any]:
    """One change of a monitor's state (or a gap that gave it a fresh start)."""
    return {
        "at": _iso(change.at),
        "from": change.frm,
        "to": change.to,
        "reason": change.reason,
        **({"details": dict(change.details)} if change.details else {}),
    }
