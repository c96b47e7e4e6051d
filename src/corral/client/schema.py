"""The database's schema, brought to this corral's newest revision (`corral db upgrade`):
before a client can connect, since a client refuses a schema it does not know."""

from __future__ import annotations

from corral import config, store


async def upgrade(settings: config.Settings) -> tuple[str | None, str | None]:
    """Create or upgrade the schema of settings.database_url: its revision before (None:
    empty) and after."""
    database = store.Store.connect(settings.database_url, timeouts=settings.timeouts)
    try:
        return await database.database.migrate()
    finally:
        await database.close()
