"""What an attempt itself may ask for, with its token: renew its lease, read its payload,
save and load its checkpoint, and publish through its tenant's pointers. Each write
carries the attempt's fence, so a stale attempt's is refused."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from corral import launching
from corral.client import service


class Attempts(service.Service):
    """An attempt's own calls."""

    async def heartbeat(self, job_id: int, fence: int) -> datetime | None:
        """News from inside attempt `fence`: renews its lease (returns the lease's new end, or
        None for a job without one). StaleFence when a newer attempt replaced it: stop."""
        return await self.store.attempts.heartbeat(job_id=job_id, fence=fence, now=self.clock.now())

    async def attempt_check(self, job_id: int, fence: int) -> None:
        """Nothing while attempt `fence` of the job may still act; StaleFence once a newer
        attempt exists or this one has ended."""
        await self.store.attempts.check(job_id=job_id, fence=fence)

    async def checkpoint_load(self, job_id: int) -> tuple[int, Any] | None:
        """The job's newest checkpoint as (the fence that saved it, its state), if any."""
        return await self.store.sinks.checkpoint_load(job_id=job_id)

    async def checkpoint_save(self, job_id: int, fence: int, state: Any) -> None:
        """Keep `state` as the job's checkpoint (StaleFence once a newer attempt saved one)."""
        await self.store.sinks.checkpoint_save(
            job_id=job_id, fence=fence, state=state, now=self.clock.now()
        )

    async def pointer_get(self, dataset: str, fence: int) -> launching.Pointer | None:
        """Where `dataset` of attempt `fence`'s tenant points now, if anywhere."""
        return await self.store.sinks.pointer_get(dataset=dataset, fence=fence)

    async def pointer_swap(
        self, dataset: str, fence: int, location: str, code_version: str | None
    ) -> launching.Pointer | int:
        """Point `dataset` at `location` if no attempt as new as `fence` published it: the
        pointer, or the fence of the newer attempt that did."""
        return await self.store.sinks.pointer_swap(
            dataset=dataset,
            fence=fence,
            location=location,
            code_version=code_version,
            now=self.clock.now(),
        )
