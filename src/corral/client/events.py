"""The events of the run log, read in pages by id: what the API's streams and the
dashboard's live pages follow."""

from __future__ import annotations

from corral import model
from corral.client import service


class Events(service.Service):
    """Read the run log in pages."""

    async def event_page(
        self, *, after: int, limit: int, job_id: int | None = None, tenant: str | None = None
    ) -> tuple[list[int], list[model.Event]]:
        """The ids of the next `limit` events after id `after` (of `job_id`, or of
        `tenant`), and those of them that can be shown."""
        return await self.store.events.page(after=after, limit=limit, job_id=job_id, tenant=tenant)

    async def event_newest(self) -> int:
        """The id of the newest event (0 for none): where a stream from now on starts. It
        also tells the database answers."""
        return await self.store.alerts.event_newest()
