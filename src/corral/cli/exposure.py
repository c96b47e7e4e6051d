"""What `corral check` warns of that could hand corral's secrets to someone else: the
settings file or the SQLite database readable by other users of the host, jobs given the
database's URL, and pods left with no way to reach corral. Warnings, never a failure:
the operator decides."""

from __future__ import annotations

import stat
from pathlib import Path

from corral import config

OTHERS = stat.S_IRGRP | stat.S_IROTH
"""Read permission for the file's group or anyone: what a job of another user needs."""


def readable(settings: config.Settings, config_file: Path | None) -> list[str]:
    """The settings file and the SQLite database, where other users of the host may read
    them: one sentence each, saying what to do."""
    out = []
    given = config_file if config_file is not None else config.DEFAULT_CONFIG_FILE
    for path, what in ((given, "the settings file"), (settings.sqlite_file, "the database")):
        if path is not None and path.is_file() and path.stat().st_mode & OTHERS:
            mode = stat.S_IMODE(path.stat().st_mode)
            out.append(
                f"{what} {path} is readable by other users (mode {mode:04o}): it holds"
                f" corral's secrets; chmod 600 {path}"
            )
    return out


def warnings(settings: config.Settings, config_file: Path | None) -> list[str]:
    """One sentence per exposure found, each saying what to do."""
    out = readable(settings, config_file)
    if settings.database_url_for_jobs is not None:
        out.append(
            "process jobs get CORRAL_DATABASE_URL (jobs_get_database_url = true, api_url"
            " unset): a job can then do anything corral can; unset jobs_get_database_url"
            " (jobs then reach corral through the attempt API with a token of their own)"
        )
    k8s = settings.executors.kubernetes
    if k8s.database_url_secret and settings.jobs_get_database_url and not settings.api_url:
        out.append(
            f"pods get the database's URL from the Secret {k8s.database_url_secret!r}"
            " (executors.kubernetes.database_url_secret, jobs_get_database_url = true): a"
            " job can then do anything corral can; set api_url and unset"
            " jobs_get_database_url"
        )
    cluster = [k for k in ("kubernetes", "argo") if k in settings.executors.enabled]
    if (
        cluster
        and not settings.api_url
        and not (k8s.database_url_secret and settings.jobs_get_database_url)
    ):
        out.append(
            f"{' and '.join(cluster)} jobs cannot heartbeat or checkpoint: a pod reaches"
            " corral only through its API, and api_url is unset; set api_url to an address"
            " pods can reach (e.g. http://corral-api.corral.svc:8080)"
        )
    return out
