"""How commands show jobs, attempts and the run log: as tables and blocks for people (never
cutting an id, a state or a name, however narrow the terminal), and as JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table
from rich.text import Text

from corral import access, launching, scheduling, shapes
from corral.cli.common import out
from corral.shapes import shown

if TYPE_CHECKING:
    from corral import cadence, client, config, model, timeouts


def when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S") if at else "-"


def table(*columns: str, keep: Sequence[str] = ()) -> Table:
    """A table whose columns fold rather than cut; the `keep` ones never wrap either."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in columns:
        t.add_column(name, overflow="fold", no_wrap=name in keep)
    return t


# --- jobs ---------------------------------------------------------------------------------------


def attempts_text(job: model.Job) -> str:
    """`charged/max`, and what did not count."""
    text = f"{job.charged_attempts}/{job.max_attempts}"
    if job.uncharged_attempts:
        text += f" (+{job.uncharged_attempts} not charged)"
    return text


def jobs_table(page: client.jobs.JobPage) -> Table:
    """A page of the job list, a row each, in 80 columns: what each job does (secrets
    redacted), its schedule, its last attempt's HTTP status or exit code and response time,
    when it runs next (times to the second; `jobs show` and --json have the rest)."""
    columns = ("id", "state", "what", "schedule", "last", "time", "next run")
    t = table(*columns, keep=("id", "state", "next run"))
    for j in page.jobs:
        facts = shapes.listed_facts(j, page.runs.get(j.id), lambda at: at)
        t.add_row(
            str(j.id),
            j.state,
            Text(what_text(facts["target"])),  # as it is: "[redacted]" is no markup
            Text(facts["schedule"] or "-"),
            last_text(facts),
            "-" if facts["response_time"] is None else f"{facts['response_time']:.3f}s",
            facts["next_run"].strftime("%m-%d %H:%M:%S") if facts["next_run"] else "-",
        )
    return t


def what_text(target: dict[str, Any]) -> str:
    """A job's target (shapes.job_target) in a few words."""
    if target["kind"] == "http":
        return f"{target['method']} {target['url']}"
    if target["kind"] == "task":
        return f"task {target['task']}"
    if "image" in target:
        return f"{target['image']}: {target['command'] or ''}".rstrip(": ")
    return str(target.get("command") or target["kind"])


def last_text(facts: dict[str, Any]) -> str:
    """The last attempt's HTTP status, else its exit code ("exit N"), else "-"."""
    if facts["last_status"] is not None:
        return str(facts["last_status"])
    if facts["last_exit_code"] is not None:
        return f"exit {facts['last_exit_code']}"
    return "-"


def print_view(view: client.jobs.JobView) -> None:
    """A job, then one block per attempt (no column of an attempt is ever cut), then its
    run log as a table whose reasons fold."""
    j = view.job
    out.print(Text.assemble((f"job {j.id}", "bold"), f"  {j.state}"))
    facts = [
        ("queue", j.queue),
        ("tenant", j.tenant),
        ("pool", j.pool or "-"),
        ("executor", j.executor),
        ("priority", str(j.priority)),
        ("attempts", attempts_text(j)),
        ("run at", when(j.run_at)),
    ]
    if j.idempotency_key:
        facts.append(("idempotency key", j.idempotency_key))
    if j.code_version:
        facts.append(("code version", j.code_version))
    facts += _callbacks(j)
    facts.append(("spec", json.dumps(shown(j.spec))))
    for name, value in facts:
        out.print(f"  {name}: {value}", markup=False, soft_wrap=False)
    for a in view.attempts:
        print_attempt(a, view.logs.get(a.id))
    events = table("at", "what", "from", "to", "reason", keep=("at", "from", "to"))
    for e in view.events:
        what = e.entity if e.attempt_id is None else f"{e.entity} (fence {e.attempt_id})"
        events.add_row(when(e.at), what, e.from_state or "-", e.to_state, e.reason)
    out.print(events)


def _callbacks(j: model.Job | Any) -> list[tuple[str, str]]:
    """What a job (or a schedule's template, as a mapping) says of callbacks."""
    said = (
        j
        if isinstance(j, Mapping)
        else {
            "callback": j.callback,
            "failure_callback": j.failure_callback,
            "callback_of": j.callback_of,
        }
    )
    facts = [
        (name.replace("_", " "), str(shown(said[name])))
        for name in ("callback", "failure_callback")
        if said.get(name)
    ]
    if said.get("callback_of") is not None:
        facts.append(("callback of", f"job {said['callback_of']}"))
    return facts


def took(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def outcome(a: model.Attempt, log: launching.RunLog | None) -> str:
    """How an attempt went, in one line: its state, exit or HTTP status, latency, class."""
    said = [str(a.state)]
    if log is not None and log.status is not None:
        said.append(f"HTTP {log.status}")
    elif a.exit_code is not None:
        said.append(f"exit {a.exit_code}")
    if log is not None and log.latency is not None:
        said.append(took(log.latency))
    elif a.started_at and a.finished_at:  # no run log kept (a quiet command): about as long
        said.append(took((a.finished_at - a.started_at).total_seconds()))
    if a.failure_class:
        said.append(f"class {a.failure_class}")
    return ", ".join(said)


OUTPUT_LINES = 3
"""How many lines of each stream `jobs show` prints: the start of an attempt's output."""


def failure_message(log: launching.RunLog | None) -> str | None:
    """A failed request's message: the first line of its response's body (its run log
    keeps the status line and headers, a blank line, then the body)."""
    response = log.stream("response") if log is not None and log.status is not None else None
    if response is None:
        return None
    _, blank, body = response.text.partition("\n\n")
    lines = [line.strip() for line in body.splitlines() if line.strip()] if blank else []
    return lines[0][:200] if lines else None


def print_attempt(a: model.Attempt, log: launching.RunLog | None = None) -> None:
    head = f"attempt {a.attempt_no}  fence {a.id}  {a.launch_name}  {a.state}"
    if not a.charged:
        head += "  (not charged)"
    out.print(Text(head, style="bold"), soft_wrap=True)
    lines = [
        f"started {when(a.started_at)}, finished {when(a.finished_at)}",
        outcome(a, log)
        + (f", at {log.address}" if log and log.address else "")
        + (f", fingerprint {a.fingerprint}" if a.fingerprint else ""),
    ]
    if a.reason:
        lines.append(f"reason: {a.reason}")
    if a.state == "failed" and (said := failure_message(log)):
        lines.append(f"message: {said}")
    if log is not None and log.trimmed_at is not None:
        lines.append(f"output: {shapes.TRIMMED} ({when(log.trimmed_at)})")
    for s in log.streams if log else ():
        shown = s.text.splitlines()
        lines.append(f"{s.name}:" + (" (cut)" if s.cut else ""))
        lines += [f"  {line[:200]}" for line in shown[:OUTPUT_LINES]]
        if len(shown) > OUTPUT_LINES:
            lines.append(f"  ... {len(shown) - OUTPUT_LINES} more lines")
    for line in lines:
        out.print(f"  {line}", markup=False)
    if log and log.streams:
        out.print(f"  all of it: corral jobs logs {a.job_id} --attempt {a.attempt_no}")


def dead_table(views: Sequence[client.jobs.JobView]) -> Table:
    t = table("id", "queue", "attempts", "last failure", "since", "class", "fingerprint")
    t.columns[0].no_wrap = True
    for v in views:
        last = v.attempts[-1] if v.attempts else None
        t.add_row(
            str(v.job.id),
            v.job.queue,
            attempts_text(v.job),
            (last.reason or "") if last else "",
            when(v.job.updated_at),
            (last.failure_class or "") if last else "",
            (last.fingerprint or "") if last else "",
        )
    return t


# --- the chain of limits ---------------------------------------------------------------------


def short(setting: str) -> str:
    return setting.removeprefix("timeouts.").removeprefix("executors.")


def _amount(c: timeouts.LinkCheck, units: int) -> float | int:
    return units / 1_000_000 if c.link.inner.startswith("timeouts.") else units


def chain_dict(settings: config.Settings) -> dict[str, Any]:
    """`corral check --json`: every link with its values (seconds, or counts), and the
    broken ones in words."""
    from corral import timeouts

    links = []
    for c in timeouts.chain(settings):
        link = c.link
        links.append(
            {
                "inner": link.inner,
                "extra": link.extra,
                "outer": link.outer,
                "margin": link.margin,
                "unit": "seconds" if link.inner.startswith("timeouts.") else "count",
                "inner_value": _amount(c, c.inner),
                "extra_value": _amount(c, c.extra) if link.extra else None,
                "outer_value": _amount(c, c.outer),
                "needed": _amount(c, c.needed),
                "spare": _amount(c, c.spare),
                "ok": c.ok,
                "applies": c.applies,
                "why": link.why,
            }
        )
    broken = timeouts.chain_violations(settings)
    return {"ok": not broken, "links": links, "broken": broken}


def chain_table(settings: config.Settings) -> Table:
    """One row a link; each setting's name on a line of its own, so a narrow terminal
    wraps between names, never inside one."""
    from corral import timeouts

    t = table("inner < outer", "values", "spare", "needs", "", keep=("spare", "needs", ""))
    t.columns[0].min_width = max(
        len(short(name)) + 3 for link in timeouts.CHAIN for name in (link.inner, link.outer)
    )
    t.columns[-1].min_width = len("BROKEN")
    t.caption = (
        "each inner limit must be shorter than the outer one by the margin it needs"
        " (timeouts.margin; timeouts.tick_margin for the sub-second links)"
    )
    for c in timeouts.chain(settings):
        link = c.link
        names = [short(link.inner)]
        if link.extra:
            names.append(f"+ {short(link.extra)}")
        names.append(f"{'<' if link.margin else '<='} {short(link.outer)}")
        t.add_row(
            "\n".join(names),
            f"{_show(c, c.inner + c.extra)} vs {_show(c, c.outer)}",
            _show(c, c.spare),
            _show(c, c.needed) if link.margin else "-",
            _status(c),
        )
    return t


def _show(c: timeouts.LinkCheck, units: int) -> str:
    """A link's amount as settings are written: 4m, 7d, 500ms, or a count."""
    from corral import durations

    if not c.link.inner.startswith("timeouts.") or units < 0:
        return c.show(units)
    return durations.format_duration(timedelta(microseconds=units)) if units else "0s"


def _status(c: timeouts.LinkCheck) -> str:
    if not c.applies:
        return "[dim]n/a[/dim]"  # a PostgreSQL link on SQLite, a pods' link with no cluster
    return "ok" if c.ok else "[red]BROKEN[/red]"


# --- schedules ----------------------------------------------------------------------------


def schedule_rule(s: scheduling.Schedule) -> str:
    if s.cron is not None:
        return f"{s.cron} ({s.tz})"
    return f"every {s.every_seconds}s"


def schedules_table(found: Sequence[scheduling.Schedule]) -> Table:
    t = table("NAME", "TENANT", "WHEN", "NEXT (UTC)", "LAST JOB", "STATE", keep=("NAME",))
    for s in found:
        state = "paused" if s.paused_at else ("ended" if s.next_due is None else "active")
        t.add_row(
            s.name,
            s.tenant,
            schedule_rule(s),
            when(s.next_due) if s.paused_at is None else "-",
            str(s.last_job_id or "-"),
            state,
        )
    return t


def nominals_table(found: Sequence[cadence.Nominal]) -> Table:
    t = table("FIRES AT (LOCAL)", "UTC", "DST", keep=("FIRES AT (LOCAL)",))
    for n in found:
        t.add_row(n.local.isoformat(), when(n.at), n.moved or "")
    return t


def print_schedule(
    s: scheduling.Schedule,
    upcoming: Sequence[cadence.Nominal],
    firings: Sequence[scheduling.Firing],
    pause_after: int = 0,
) -> None:
    """A schedule for `corral schedules show`; `pause_after` the one in effect (its own,
    or its tenant's)."""
    out.print(f"schedule {s.name} (tenant {s.tenant}): {schedule_rule(s)}")
    state = "paused since " + when(s.paused_at) if s.paused_at else "active"
    out.print(f"  {state}; catch-up {s.catchup}, overlap {s.overlap}; missed {s.missed_total}")
    if s.paused_reason:
        out.print(f"  {s.paused_reason}")
    whose = "" if s.pause_after is not None else " (its tenant's default)"
    said = f"after {pause_after} failed firings in a row" if pause_after else "never"
    out.print(f"  pause_after {pause_after}{whose}: pauses {said}")
    spec = shown(s.template.get("spec"))
    out.print(f"  runs: {json.dumps(spec)} on {s.template.get('executor')}")
    for name, value in _callbacks(s.template):
        out.print(f"  {name}: {value}", markup=False, soft_wrap=False)
    if upcoming:
        out.print("next firings:")
        out.print(nominals_table(upcoming))
    if firings:
        t = table("NOMINAL (UTC)", "OUTCOME", "JOB", "LATE", "NOTE", keep=("NOMINAL (UTC)",))
        for f in firings:
            t.add_row(
                when(f.nominal_at),
                f.outcome.value,
                str(f.job_id or "-"),
                f"{f.lateness_seconds:.1f}s",
                f.note or "",
            )
        out.print("latest firings:")
        out.print(t)


def secrets_table(found: Sequence[access.SigningSecret]) -> Table:
    t = table("id", "tenant", "fingerprint", "made", "signs until", keep=("id", "fingerprint"))
    for s in found:
        t.add_row(
            str(s.id),
            s.tenant,
            s.fingerprint,
            when(s.created_at),
            when(s.retires_at) if s.retires_at else "(current)",
        )
    return t


def channel_dict(channel: Any) -> dict[str, Any]:
    """A channel as it may be shown: its kind and where it goes, secrets hidden."""
    from corral.redaction import REDACTED, redacted

    kind = channel.kind
    if kind == "email":
        where = redacted(channel.smtp_url)
        return {"kind": kind, "to": list(channel.to), "from": channel.sender, "smtp_url": where}
    if kind == "slack":
        return {"kind": kind, "webhook_url": REDACTED}
    return {"kind": kind, "url": redacted(channel.url), "signed": bool(channel.secret)}


def alert_rules_table(rules: dict[str, dict[str, Any]]) -> Table:
    t = table("rule", "on", "match", "channels", "throttle", "muted until", keep=("rule",))
    for name, r in rules.items():
        match = ", ".join(f"{k}={v}" for k, v in r["match"].items()) or "-"
        muted = r.get("muted_until")
        t.add_row(
            name,
            ", ".join(r["on"]),
            match,
            ", ".join(r["channels"]),
            f"{r['throttle']:g}s",
            when(datetime.fromisoformat(muted)) if muted else "-",
        )
    return t


def channels_table(channels: dict[str, dict[str, Any]]) -> Table:
    t = table("channel", "kind", "to", keep=("channel", "kind"))
    for name, c in channels.items():
        to = ", ".join(c["to"]) if c["kind"] == "email" else c.get("url", "(webhook URL)")
        t.add_row(name, c["kind"], to)
    return t


def alerts_table(found: Sequence[Any]) -> Table:
    t = table("id", "made", "rule", "channel", "what", "state", "tries", keep=("id", "state"))
    for a in found:
        what = f"{a.kind} {a.cause} {a.subject}" + (f" job {a.job_id}" if a.job_id else "")
        state = a.state + (f" ({a.last_error})" if a.last_error and a.state != "delivered" else "")
        t.add_row(str(a.id), when(a.created_at), a.rule, a.channel, what, state, str(a.tries))
    return t


def token_expiry(t: Any) -> str:
    if t.revoked_at is not None:
        return f"revoked {when(t.revoked_at)}"
    return "never expires" if t.expires_at is None else f"expires {when(t.expires_at)}"


def users_table(found: Sequence[access.User]) -> Table:
    t = table("name", "tenant", "role", "added", keep=("name", "role"))
    for u in found:
        t.add_row(u.name, u.tenant or "(all)", str(u.role), when(u.created_at))
    return t


def tokens_table(found: Sequence[Any]) -> Table:
    t = table("id", "name", "tenant", "role", "created", "state", keep=("id", "role"))
    for k in found:
        t.add_row(
            str(k.id), k.name, k.tenant or "(all)", str(k.role), when(k.created_at), token_expiry(k)
        )
    return t
