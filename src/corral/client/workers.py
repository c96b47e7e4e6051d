"""Python workers and parked jobs: who is registered, what waits for a worker that can
read it, and a person's release of a parked job."""

from __future__ import annotations

from collections.abc import Sequence

from corral import python_tasks
from corral.client import service


class Workers(service.Service):
    """Registered workers and the jobs parked for them."""

    async def workers(self, *, every: bool = False) -> list[python_tasks.Worker]:
        """The workers live now (their lease not run out); `every`: the stopped ones too."""
        return await self.store.workers.list(since=self.since(), live=not every)

    async def parked(
        self, *, task: str | None = None, tenant: str | None = None, limit: int = 100
    ) -> list[python_tasks.ParkedJob]:
        """The parked jobs, oldest first: of `task`, of `tenant` (None: any)."""
        return await self.store.workers.parked_list(task=task, tenant=tenant, limit=limit)

    async def parked_release(
        self, *, job_ids: Sequence[int] = (), task: str | None = None
    ) -> list[int]:
        """Queue parked jobs again by hand (those of `job_ids`, or of `task`): their ids."""
        return await self.store.workers.parked_release(
            job_ids=job_ids, task=task, now=self.clock.now()
        )

    async def payload_versions(
        self, *, tasks: Sequence[str]
    ) -> dict[tuple[str, int], dict[str, int]]:
        """For each (task, version) of `tasks` among jobs not yet run and the schedules
        that make them: how many of each (by job state, and "schedule")."""
        return await self.store.workers.payload_versions(tasks=tasks)
