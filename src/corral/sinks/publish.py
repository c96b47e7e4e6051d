"""Publisher: write-audit-publish for file datasets, so readers see exactly one attempt's
complete output, never a torn mix of two.

Each attempt writes into a staging folder of its own, `<root>/<dataset>/_staging/fence=<n>-<token>/`
(`root` a local path or any fsspec URL: `s3://bucket/warehouse`, `memory://...`),
audits it, and publishes by a compare-and-swap on the dataset's pointer in corral's store:
the swap applies only when the pointer holds a lower fence. Two attempts running at once
write to different folders; the newer one's swap wins and the older one's is refused, in
whichever order they finish. Readers resolve the pointer (`resolve`) and read the folder
it names.

    from corral.sinks import MinRows, Publisher, UniqueKeys

    pub = Publisher("sales/2026-11-30", root="/data/warehouse")
    stage = pub.stage()                        # a fresh folder for this attempt
    pub.write_rows("part-0.jsonl", rows)       # or write any files into `stage`
    pub.publish(audits=[MinRows(1000), UniqueKeys(["order_id"])])

A failed audit publishes nothing and raises AuditFailed saying why; a refused swap raises
StaleFenceError. `clean()` removes staging folders older than the retention, never the
one the pointer names.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fsspec

from corral import clock, config, errors, launching
from corral.sinks.fence import (
    Writer,
    run_blocking,
    store_for,
    writer,
)
from corral.worker import own_api
from corral.worker.api import ApiReach, AttemptApi

STAGING = "_staging"
Audit = Callable[[str], str | None]
"""A check of a staging folder (its URL): None when it passes, else what is wrong."""


def rows_of(folder: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of every `*.jsonl` and `*.csv` file in a folder (a path or fsspec URL):
    what the built-in audits read, and what readers of a resolved dataset can read."""
    fs, root = fsspec.core.url_to_fs(str(folder))
    for path in sorted(fs.find(root)):
        if path.endswith(".jsonl"):
            with fs.open(path, "r") as lines:
                yield from (json.loads(line) for line in lines if line.strip())
        elif path.endswith(".csv"):
            with fs.open(path, "r", newline="") as handle:
                yield from csv.DictReader(io.StringIO(handle.read()))


@dataclass(frozen=True)
class MinRows:
    """At least `count` rows."""

    count: int

    def __call__(self, folder: str) -> str | None:
        n = sum(1 for _ in rows_of(folder))
        return None if n >= self.count else f"{n} rows, fewer than the {self.count} required"


@dataclass(frozen=True)
class UniqueKeys:
    """No two rows share the values of `columns`."""

    columns: Sequence[str]

    def __call__(self, folder: str) -> str | None:
        seen: set[tuple[Any, ...]] = set()
        for row in rows_of(folder):
            key = tuple(row.get(c) for c in self.columns)
            if key in seen:
                return f"key {dict(zip(self.columns, key, strict=True))} appears twice"
            seen.add(key)
        return None


class Publisher:
    """Write-audit-publish of one dataset by this attempt."""

    def __init__(
        self,
        dataset: str,
        *,
        root: str | Path,
        fs: fsspec.AbstractFileSystem | None = None,
        fence: int | None = None,
        code_version: str | None = None,
        settings: config.Settings | None = None,
        retention: timedelta = timedelta(days=7),
        clk: clock.Clock | None = None,
    ) -> None:
        if not dataset or dataset.startswith("/") or ".." in Path(dataset).parts:
            raise errors.InvalidInput(f"dataset {dataset!r}: a relative path without '..'")
        self.dataset = dataset
        if fs is None:
            fs, root = fsspec.core.url_to_fs(str(root))
        self.fs: fsspec.AbstractFileSystem = fs
        # One spelling of every path: what `ls` gives back (no protocol).
        self.root = str(fs._strip_protocol(str(root))).rstrip("/")
        self.writer: Writer = writer(fence, code_version)
        self.settings = settings
        self.retention = retention
        self.clock = clk or clock.SystemClock()
        self._staging: str | None = None
        self._published = False

    @property
    def staging(self) -> str:
        """This attempt's folder for this try (a path on `fs`): `fence=<n>-<token>`, new
        at each `stage()`, so no try ever deletes or writes into another's folder, the
        published one included."""
        if self._staging is None:
            raise errors.InvalidInput(f"{self.dataset}: call stage() before writing")
        return self._staging

    @property
    def location(self) -> str:
        """The staging folder as a URL readers can open (`file:///...`, `s3://...`)."""
        return str(self.fs.unstrip_protocol(self.staging))

    def stage(self) -> str:
        """Make a new staging folder for this attempt and return it. InvalidInput when
        this attempt (or a newer one) has published the dataset already."""
        pointer = run_blocking(self._pointer())
        if pointer is not None and pointer.fence >= self.writer.fence:
            raise errors.InvalidInput(
                f"{self.dataset}: fence {pointer.fence} has published it already; a new"
                f" output needs a new attempt (this is fence {self.writer.fence})"
            )
        folder = f"fence={self.writer.fence}-{secrets.token_hex(4)}"
        self._staging = f"{self.root}/{self.dataset}/{STAGING}/{folder}"
        self._published = False
        self.fs.makedirs(self._staging, exist_ok=False)
        return self._staging

    def write_rows(self, name: str, rows: Iterable[Mapping[str, Any]]) -> str:
        """Write rows as JSON Lines into the staging folder (never after publish)."""
        if self._published:
            raise errors.InvalidInput(f"{self.dataset}: published already; stage() again")
        path = f"{self.staging}/{name}"
        with self.fs.open(path, "w") as out:
            for row in rows:
                out.write(json.dumps(row, sort_keys=True) + "\n")
        return path

    def publish(self, audits: Sequence[Audit] = ()) -> launching.Pointer:
        """Audit the staging folder, then swap the pointer to it. AuditFailed (nothing
        published) when an audit fails; StaleFenceError when a newer attempt has
        published already. Publishing the same folder again is not refused."""
        return run_blocking(self.publish_async(audits))

    async def publish_async(self, audits: Sequence[Audit] = ()) -> launching.Pointer:
        """`publish` for async code (the audits read files: they run in a thread)."""
        staged = self.staging
        problems = await asyncio.to_thread(self._audit, staged, audits)
        if problems:
            raise errors.AuditFailed(self.dataset, problems)
        swapped = await self._swap()
        if not isinstance(swapped, launching.Pointer):
            raise errors.StaleFenceError(
                f"{self.dataset}: not published: fence {swapped} published it already,"
                f" newer than (or the same as) this attempt's {self.writer.fence}",
                fence=self.writer.fence,
                newer=swapped,
            )
        self._published = True
        return swapped

    async def _swap(self) -> launching.Pointer | int:
        """The compare-and-swap: over corral's API with this attempt's token when it has
        one and writes as itself, else on the store."""
        if (reach := self._api()) is not None:
            async with AttemptApi(reach) as api:
                return await api.pointer_swap(
                    dataset=self.dataset,
                    location=self.location,
                    code_version=self.writer.code_version,
                )
        db = store_for(self.settings)
        try:
            return await db.sinks.pointer_swap(
                dataset=self.dataset,
                fence=self.writer.fence,
                location=self.location,
                code_version=self.writer.code_version,
                now=self.clock.now(),
            )
        finally:
            await db.close()

    def _api(self) -> ApiReach | None:
        return own_api(self.writer.fence)

    async def _pointer(self) -> launching.Pointer | None:
        """The dataset's pointer, of this attempt's tenant."""
        return await _pointer(
            self.dataset, self.settings, reach=self._api(), fence=self.writer.fence
        )

    def _audit(self, staged: str, audits: Sequence[Audit]) -> list[str]:
        if not self.fs.isdir(staged):
            raise errors.InvalidInput(f"{self.dataset}: nothing staged at {self.location}")
        return [p for audit in audits if (p := audit(self.location)) is not None]

    def clean(self) -> list[str]:
        """Remove staging folders that can never be published and are older than the
        retention: those of fences below the published one, and this fence's other tries.
        The published folder, and folders of newer fences (still running, perhaps), stay.
        Returns what was removed."""
        pointer = run_blocking(self._pointer())
        cutoff = self.clock.now() - self.retention
        parent = f"{self.root}/{self.dataset}/{STAGING}"
        if pointer is None or not self.fs.exists(parent):
            return []  # nothing published: every folder may still be a running attempt's
        current = str(self.fs._strip_protocol(pointer.location)).rstrip("/")
        removed = []
        for folder in sorted(str(f) for f in self.fs.ls(parent, detail=False)):
            fence = _fence_of(folder)
            if fence is None or folder.rstrip("/") == current:
                continue
            if fence <= pointer.fence and self._changed(folder) < cutoff:
                self.fs.rm(folder, recursive=True)
                removed.append(folder)
        return removed

    def _changed(self, folder: str) -> datetime:
        """When anything in `folder` last changed (object stores have no folder times;
        a folder with no time at all counts as changed now)."""
        times = [self.fs.modified(f) for f in self.fs.find(folder)]
        with contextlib.suppress(OSError, NotImplementedError, ValueError, KeyError):
            times.append(self.fs.modified(folder))
        aware = [t if t.tzinfo else t.replace(tzinfo=UTC) for t in times]
        return max(aware, default=self.clock.now())


def _fence_of(folder: str) -> int | None:
    name = folder.rstrip("/").rsplit("/", 1)[-1]
    fence = name.removeprefix("fence=").split("-", 1)[0]
    return int(fence) if name.startswith("fence=") and fence.isdigit() else None


async def _pointer(
    dataset: str,
    settings: config.Settings | None,
    *,
    reach: ApiReach | None = None,
    tenant: str | None = None,
    fence: int | None = None,
) -> launching.Pointer | None:
    """`dataset`'s pointer: over the API (the attempt's tenant's), else on the store, of
    `tenant` or of the tenant of attempt `fence`'s job."""
    if reach is not None:
        async with AttemptApi(reach) as api:
            return await api.pointer_get(dataset)
    db = store_for(settings)
    try:
        return await db.sinks.pointer_get(dataset=dataset, tenant=tenant, fence=fence)
    finally:
        await db.close()


def resolve(
    dataset: str, *, tenant: str | None = None, settings: config.Settings | None = None
) -> str | None:
    """The folder (URL) readers of `dataset` read now: one attempt's whole output. None
    before anything was published. `tenant`: whose dataset (default: CORRAL_TENANT, the
    tenant of the job this runs in, else `default`)."""
    return run_blocking(resolve_async(dataset, tenant=tenant, settings=settings))


async def resolve_async(
    dataset: str, *, tenant: str | None = None, settings: config.Settings | None = None
) -> str | None:
    """`resolve` for async code."""
    tenant = tenant or os.environ.get("CORRAL_TENANT") or "default"
    pointer = await _pointer(dataset, settings, tenant=tenant)
    return None if pointer is None else pointer.location
