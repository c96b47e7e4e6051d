"""The reconciler's maintenance passes: what it keeps in order besides repairing attempts.

Before the repairs, launches an earlier corral made without the installation label are
given it (else they would be taken for lost and launched again). After them, each pass
parks the Python tasks' jobs no live worker reads (and unparks those one reads again),
stops orphans (launches whose attempt has ended or whose job was cancelled, and the parts
a launch left running when it went), forgets launches past their executor's retention,
removes jobs past `retention.jobs`, trims the run logs of each tenant past its
`run_log_bytes` (its oldest finished jobs' first), and looks for missed SLAs.
"""

from __future__ import annotations

import asyncio
import logging

from corral import core, errors, launching, model, recovery, store, tenancy, usage
from corral.executors import base
from corral.executors.base import Executor
from corral.recovery import Pass

log = logging.getLogger("corral.reconciler")
J, P = model.JobState, launching.Phase

REMOVE_BATCH = 500
REMOVE_BATCHES = 20
RETENTION_EVERY = 600.0
"""Seconds between two looks for jobs past their retention, once a look found them all."""
LABEL_EVERY = 60.0
"""Seconds between two looks for launches an earlier corral made without the installation
label, once a look labelled none (an upgrade's older processes may still be making them)."""
TRIM_BATCH = 500
TRIM_BATCHES = 20
"""A tenant's run logs trimmed in one transaction, and such batches for one tenant a pass."""
TRIM_EVERY = 60.0
"""Seconds between two looks at the run-log bytes each tenant keeps, once a look left every
tenant under its run_log_bytes (or with nothing more it may trim)."""
SHOWN_JOBS = 10
"""The most job ids a line about a trim names."""


class Maintenance:
    """The maintenance passes of one reconciler, with when each is next due."""

    def __init__(self, loop: core.Core) -> None:
        self.core = loop
        self._label_due = 0.0  # when (clock.monotonic) to look for unlabelled launches
        self._retention_due = 0.0  # when (clock.monotonic) finished jobs are next looked for
        self._trim_due = 0.0  # when (clock.monotonic) run-log bytes are next looked at
        self._untrimmable: set[str] = set()  # tenants said to be over with nothing to trim

    async def before(self, summary: Pass) -> None:
        """What comes before the repairs: the installation label, when a look is due."""
        if self.core.clock.monotonic() >= self._label_due:
            await self._label_unlabelled(summary)

    async def after(self, summary: Pass) -> None:
        """What comes after the repairs: parking, orphans, retention and SLAs."""
        loop = self.core
        now = loop.clock.now()
        since = now - loop.t.lease_timeout
        summary.parked += await loop.store.workers.park_unread(now=now, since=since)
        summary.unparked += await loop.store.workers.unpark_read(now=loop.clock.now(), since=since)
        for executor in loop.executors.values():
            await self._stop_orphans(executor, summary)
        if loop.clock.monotonic() >= self._retention_due:
            await self._remove_old_jobs(summary)
        if loop.clock.monotonic() >= self._trim_due:
            await self._trim_run_logs(summary)
        summary.slas_missed = await loop.store.alerts.sla_check(now=loop.clock.now())

    # --- an upgrade: launches made before the installation label ----------------------------

    async def _label_unlabelled(self, summary: Pass) -> None:
        """Give this installation's label to the launches an earlier corral made without it
        whose name and identity labels match an attempt in this store, before they are
        looked at: unlabelled, they are not this installation's to read, and would be taken
        for lost and launched again. Others (another installation's) are left alone."""
        labelled = 0
        for executor in self.core.executors.values():
            if isinstance(executor, base.SharesPlatform):
                labelled += await self._label_ours(executor)
        summary.labelled += labelled
        self._label_due = 0.0 if labelled else self.core.clock.monotonic() + LABEL_EVERY

    async def _label_ours(self, executor: base.SharesPlatform) -> int:
        try:
            found = await executor.list_unlabelled()
        except errors.ExecutorError as exc:
            log.warning("cannot list launches without the installation label: %s", exc)
            return 0
        named = {o.identity.fence: o for o in found if o.identity is not None}
        states = await self.core.store.attempts.states(fences=list(named)) if named else {}
        ours = [
            obs.name
            for fence, obs in named.items()
            if (st := states.get(fence)) is not None
            and st.identity == obs.identity
            and obs.name == model.launch_name(st.identity.job_id, st.identity.attempt_no)
        ]
        if not ours:
            return 0
        try:
            labelled = await executor.label(ours)
        except errors.ExecutorError as exc:
            log.warning("could not label %d launches, will try again: %s", len(ours), exc)
            return 0
        if labelled:
            log.info("labelled %d launches an earlier corral made: %s", len(labelled), labelled)
        return len(labelled)

    # --- orphans ---------------------------------------------------------------------------

    async def _stop_orphans(self, executor: Executor, summary: Pass) -> None:
        mine = {model.MANAGED_BY: model.MANAGER}
        try:
            if isinstance(executor, base.Forgets):
                managed = await executor.list_live(mine)
            else:
                managed = await executor.list_managed(mine)
        except errors.ExecutorError as exc:
            log.warning("%s: cannot list launches for orphans: %s", executor.kind, exc)
            return
        if isinstance(executor, base.Forgets):
            await self._forget_old(executor, summary)
        live = {
            o.identity.fence: o
            for o in managed
            if o.identity is not None and o.phase in (P.PENDING, P.RUNNING)
        }
        states = await self.core.store.attempts.states(fences=list(live))
        orphans = [
            (obs, status)
            for fence, obs in live.items()
            if (status := states.get(fence)) is not None
            and status.identity == obs.identity  # the very attempt, not a namesake fence
            and (
                status.attempt_state in model.FINAL_ATTEMPT_STATES
                or status.job_state == J.CANCELLED
            )
        ]
        await asyncio.gather(
            *(self._stop_orphan(executor, obs, st, summary) for obs, st in orphans)
        )
        if isinstance(executor, base.LeavesStrays):
            await self._stop_strays(executor, summary)

    async def _stop_strays(self, executor: base.LeavesStrays, summary: Pass) -> None:
        """Stop the parts a launch left running (pods) whose launch is gone, whatever
        their attempt's state (with no launch to observe, recovery calls it lost): a pod
        orphaned by its Job's delete must not run beside the attempt that replaces its
        own. A pod whose launch is still there goes with it: the launch is the orphan
        sweep's to stop (a Job deleted, its pods with it), never the pod alone, which
        would end the Job as failed first and leave it, finished, for its TTL."""
        try:
            strays = await executor.list_strays({model.MANAGED_BY: model.MANAGER})
        except errors.ExecutorError as exc:
            log.warning("cannot list stray pods for orphans: %s", exc)
            return
        why = "orphan pod stopped: its launch is gone"
        doomed = [s for s in strays if s.launch_gone]
        await asyncio.gather(*(self._stop_one_stray(executor, s, why, summary) for s in doomed))

    async def _stop_one_stray(
        self, executor: base.LeavesStrays, stray: base.Stray, why: str, summary: Pass
    ) -> None:
        try:
            await executor.stop_stray(stray)
        except errors.ExecutorError as exc:
            log.warning("%s: could not stop it, will try again: %s", stray.name, exc)
            return
        log.info("%s/%s (of %s): %s", stray.namespace, stray.name, stray.launch_name, why)
        summary.orphans_cancelled += 1

    async def _forget_old(self, executor: base.Forgets, summary: Pass) -> None:
        """Forget launches that finished more than the executor's retention ago, once the
        store holds their attempts as ended (never one recovery may still read)."""
        try:
            ended = await executor.list_ended(self.core.clock.now() - executor.retention)
        except errors.ExecutorError as exc:
            log.warning("%s: cannot list old launches: %s", executor.kind, exc)
            return
        old = {
            o.identity.fence: o
            for o in ended
            if o.identity is not None and o.labels.get(model.MANAGED_BY) == model.MANAGER
        }
        if not old:
            return
        states = await self.core.store.attempts.states(fences=list(old))
        names = [
            obs.name
            for fence, obs in old.items()
            if (st := states.get(fence)) is not None
            and st.identity == obs.identity
            and st.attempt_state in model.FINAL_ATTEMPT_STATES
        ]
        if names:
            try:
                await executor.forget(names)
            except errors.ExecutorError as exc:
                log.warning("%s: could not remove old launches: %s", executor.kind, exc)
                return
            summary.forgotten += len(names)
            log.info("%s: removed %d launches past their retention", executor.kind, len(names))

    async def _remove_old_jobs(self, summary: Pass) -> None:
        """Remove the jobs that finished longer than `retention.jobs` ago, with their
        attempts, events and run logs: up to REMOVE_BATCHES batches a pass, then not again
        for RETENTION_EVERY unless that was not all."""
        before = self.core.clock.now() - self.core.settings.retention.jobs
        for _ in range(REMOVE_BATCHES):
            removed = await self.core.store.runlogs.forget(before=before, limit=REMOVE_BATCH)
            summary.jobs_removed += removed
            if removed < REMOVE_BATCH:
                self._retention_due = self.core.clock.monotonic() + RETENTION_EVERY
                break
        while (
            await self.core.store.alerts.forget(before=before, limit=REMOVE_BATCH) == REMOVE_BATCH
        ):
            pass  # sent alerts go with the jobs of their age
        await self.core.store.workers.forget(before=before)  # what each read is kept, the lowest
        if summary.jobs_removed:
            log.info("removed %d jobs that finished before %s", summary.jobs_removed, before)

    # --- each tenant's run_log_bytes ------------------------------------------------------

    async def _trim_run_logs(self, summary: Pass) -> None:
        """Trim the run logs of each tenant past its run_log_bytes, its oldest finished
        jobs' first: up to TRIM_BATCHES batches of TRIM_BATCH logs a tenant a pass, then
        not again for TRIM_EVERY unless a tenant had more to trim."""
        tenants = self.core.settings.tenants
        kept = await self.core.store.runlogs.kept()
        limits = {name: tenancy.resolved(tenants, name).run_log_bytes for name in kept}
        over = {name: usage.excess(kept[name], limit) for name, limit in limits.items()}
        more = False
        for name, excess in sorted(over.items()):
            if excess:
                more |= await self._trim_tenant(name, kept[name], limits[name], summary)
        self._untrimmable &= {name for name, excess in over.items() if excess}
        self._trim_due = 0.0 if more else self.core.clock.monotonic() + TRIM_EVERY

    async def _trim_tenant(self, tenant: str, kept: int, limit: int, summary: Pass) -> bool:
        """Trim `tenant`'s run logs down to `limit` bytes where its finished jobs' logs
        allow, in batches; whether it has more to trim than this pass took."""
        over, logs, freed = kept - limit, 0, 0
        jobs: list[int] = []
        for _ in range(TRIM_BATCHES):
            done = await self.core.store.runlogs.trim(
                tenant=tenant, over=over - freed, limit=TRIM_BATCH, now=self.core.clock.now()
            )
            logs, freed, jobs = logs + done.logs, freed + done.bytes, [*jobs, *done.jobs]
            if freed >= over or not done.more:
                break
        summary.logs_trimmed += logs
        if logs:
            log.info(
                "tenant %r kept %d bytes of run logs, over its run_log_bytes %d: trimmed %d"
                " logs (%d bytes) of its oldest finished jobs, %s",
                tenant, kept, limit, logs, freed, _named(jobs),
            )  # fmt: skip
        if freed < over and not done.more and tenant not in self._untrimmable:
            self._untrimmable.add(tenant)
            log.warning(
                "tenant %r keeps %d bytes of run logs past its run_log_bytes %d that no trim"
                " may take: its quarantined jobs' logs, and those of jobs not finished",
                tenant, kept - freed - limit, limit,
            )  # fmt: skip
        return freed < over and done.more

    async def _stop_orphan(
        self, executor: Executor, obs: launching.Observation, status: store.Status, summary: Pass
    ) -> None:
        why = f"orphan cancelled: attempt is {status.attempt_state}, job is {status.job_state}"
        if not await recovery.stop(executor, obs.name, self.core.t.cancel_grace):
            return
        await self.core.store.events.note(
            job_id=status.identity.job_id,
            attempt_id=status.identity.fence,
            state=status.attempt_state,
            reason=why,
            now=self.core.clock.now(),
            details={"launch_name": obs.name},
        )
        log.info("%s: %s", obs.name, why)
        summary.orphans_cancelled += 1


def _named(jobs: list[int]) -> str:
    """Job ids for a log line: the first SHOWN_JOBS, and how many more."""
    shown = ", ".join(str(job_id) for job_id in jobs[:SHOWN_JOBS])
    more = len(jobs) - SHOWN_JOBS
    return f"jobs {shown}" + (f" and {more} more" if more > 0 else "")
