"""What `corral check` warns of that could hand corral's secrets to someone else: the
settings file or the SQLite database readable by other users of the host, and process
jobs given the database's URL. Warnings, never a failure: the operator decides."""

from __future__ import annotations

import stat
from pathlib import Path

from corral import config

OTHERS = stat.S_IRGRP | stat.S_IROTH
"""Read permission for the file's group or anyone: what a job of another user needs."""


def warnings(settings: config.Settings, config_file: Path | None) -> list[str]:
    """One sentence per exposure found, each saying what to do."""
    out = []
    given = config_file if config_file is not None else config.DEFAULT_CONFIG_FILE
    for path, what in ((given, "the settings file"), (settings.sqlite_file, "the database")):
        if path is not None and path.is_file() and path.stat().st_mode & OTHERS:
            mode = stat.S_IMODE(path.stat().st_mode)
            out.append(
                f"{what} {path} is readable by other users (mode {mode:04o}): it holds"
                f" corral's secrets; chmod 600 {path}"
            )
    if settings.database_url_for_jobs is not None:
        out.append(
            "process jobs get CORRAL_DATABASE_URL (jobs_get_database_url = true, api_url"
            " unset): a job can then do anything corral can; set api_url (jobs then hold only"
            " their attempt token) or jobs_get_database_url = false"
        )
    return out
