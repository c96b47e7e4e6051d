"""Publisher: write-audit-publish for file datasets, so readers see exactly one attempt's
complete output, never a torn mix of two.

Each attempt writes into a staging folder of its own, `<root>/<dataset>/_staging/fence=<n>/`
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

import contextlib
import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fsspec

from corral import clock, config, errors, model
from corral.sinks.fence import StaleFenceError, Writer, run_blocking, store_for, writer

STAGING = "_staging"
Audit = Callable[[str], str | None]
"""A check of a staging folder (its URL): None when it passes, else what is wrong."""


class AuditFailed(errors.CorralError):
    """Raised when a staged output fails an audit: nothing was published."""

    def __init__(self, dataset: str, problems: Sequence[str]) -> None:
        super().__init__(f"{dataset}: not published: " + "; ".join(problems))
        self.problems = list(problems)


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
        self.root = str(root).rstrip("/")
        self.writer: Writer = writer(fence, code_version)
        self.settings = settings
        self.retention = retention
        self.clock = clk or clock.SystemClock()

    @property
    def staging(self) -> str:
        """This attempt's own folder (a path on `fs`)."""
        return f"{self.root}/{self.dataset}/{STAGING}/fence={self.writer.fence}"

    @property
    def location(self) -> str:
        """The staging folder as a URL readers can open (`file:///...`, `s3://...`)."""
        return str(self.fs.unstrip_protocol(self.staging))

    def stage(self) -> str:
        """Make this attempt's staging folder, emptied of an earlier try of the same
        attempt, and return it."""
        if self.fs.exists(self.staging):
            self.fs.rm(self.staging, recursive=True)
        self.fs.makedirs(self.staging, exist_ok=True)
        return self.staging

    def write_rows(self, name: str, rows: Iterable[Mapping[str, Any]]) -> str:
        """Write rows as JSON Lines into the staging folder."""
        path = f"{self.staging}/{name}"
        with self.fs.open(path, "w") as out:
            for row in rows:
                out.write(json.dumps(row, sort_keys=True) + "\n")
        return path

    def publish(self, audits: Sequence[Audit] = ()) -> model.Pointer:
        """Audit the staging folder, then swap the pointer to it. AuditFailed (nothing
        published) when an audit fails; StaleFenceError when a newer attempt has
        published already."""
        return run_blocking(self.publish_async(audits))

    async def publish_async(self, audits: Sequence[Audit] = ()) -> model.Pointer:
        if not self.fs.isdir(self.staging):
            raise errors.InvalidInput(f"{self.dataset}: nothing staged at {self.location}")
        problems = [p for audit in audits if (p := audit(self.location)) is not None]
        if problems:
            raise AuditFailed(self.dataset, problems)
        db = store_for(self.settings)
        try:
            held = await db.pointer_swap(
                dataset=self.dataset,
                fence=self.writer.fence,
                location=self.location,
                code_version=self.writer.code_version,
                now=self.clock.now(),
            )
            if held is not None:
                raise StaleFenceError(
                    f"{self.dataset}: not published: fence {held} published it already,"
                    f" newer than (or the same as) this attempt's {self.writer.fence}",
                    fence=self.writer.fence,
                    newer=held,
                )
            pointer = await db.pointer_get(dataset=self.dataset)
        finally:
            await db.close()
        assert pointer is not None
        return pointer

    def clean(self) -> list[str]:
        """Remove staging folders last changed more than `retention` ago, except the one
        the pointer names. Returns what was removed."""
        current = resolve(self.dataset, settings=self.settings)
        cutoff = self.clock.now() - self.retention
        parent = f"{self.root}/{self.dataset}/{STAGING}"
        removed = []
        folders = self.fs.ls(parent, detail=False) if self.fs.exists(parent) else []
        for folder in sorted(str(f) for f in folders):
            if self.fs.unstrip_protocol(folder) != current and self._changed(folder) < cutoff:
                self.fs.rm(folder, recursive=True)
                removed.append(folder)
        return removed

    def _changed(self, folder: str) -> datetime:
        """When anything in `folder` last changed (object stores have no folder times)."""
        times = [self.fs.modified(f) for f in self.fs.find(folder)]
        with contextlib.suppress(OSError, NotImplementedError, ValueError, KeyError):
            times.append(self.fs.modified(folder))
        return max((t if t.tzinfo else t.replace(tzinfo=UTC) for t in times), default=_EPOCH)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def resolve(dataset: str, *, settings: config.Settings | None = None) -> str | None:
    """The folder (URL) readers of `dataset` read now: one attempt's whole output. None
    before anything was published."""
    return run_blocking(resolve_async(dataset, settings=settings))


async def resolve_async(dataset: str, *, settings: config.Settings | None = None) -> str | None:
    """`resolve` for async code."""
    db = store_for(settings)
    try:
        pointer = await db.pointer_get(dataset=dataset)
    finally:
        await db.close()
    return None if pointer is None else pointer.location
