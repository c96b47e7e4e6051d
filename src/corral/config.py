"""Settings: one validated object read from `corral.toml` and `CORRAL_*` environment variables.

Environment variables win over the file; nested settings use a double underscore
(`CORRAL_TIMEOUTS__ATTEMPT_DEADLINE=240`). Durations accept seconds or `500ms`, `90s`,
`4m`, `1h`, `1h30m`. Unknown keys and bad values raise ConfigError naming the setting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from corral import errors

DEFAULT_CONFIG_FILE = Path("corral.toml")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
MIN_DURATION, MAX_DURATION = 0.001, 365 * 86400.0
_NUMBER = re.compile(r"\d+(\.\d+)?")


def parse_duration(value: Any) -> timedelta:
    """Seconds (a number or a numeric string) or a string such as `90s`, `4m`, `1h30m`."""
    seconds = _seconds(value)
    if seconds is None:
        raise ValueError(f"{value!r} is not a duration: use seconds or e.g. 500ms, 90s, 4m, 1h")
    if not MIN_DURATION <= seconds <= MAX_DURATION:
        raise ValueError(f"{value!r}: a duration must be between 1ms and 365 days")
    return timedelta(seconds=seconds)


def _seconds(value: Any) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str) or not (text := value.strip().lower()):
        return None
    if _NUMBER.fullmatch(text):
        return float(text)
    if _DURATION.sub("", text) == "":
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION.findall(text))
    return None


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class Timeouts(BaseModel):
    """Time limits. Each inner limit is shorter than the one around it (see DESIGN.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempt_deadline: Duration = Field(
        timedelta(seconds=240), description="An attempt is stopped after this long."
    )
    recovery_grace: Duration = Field(
        timedelta(seconds=360),
        description="After this long without a platform object, an attempt counts as lost.",
    )
    launch_grace: Duration = Field(
        timedelta(seconds=30),
        description="A launching attempt older than this is checked by recovery.",
    )
    lease_timeout: Duration = Field(
        timedelta(seconds=60),
        description="A running attempt without news (observation, heartbeat) this long is checked.",
    )
    reconcile_interval: Duration = Field(
        timedelta(seconds=10), description="How often the reconciler makes a pass."
    )
    margin: Duration = Field(
        timedelta(seconds=5),
        description="How much shorter an inner time limit must be than the one around it.",
    )
    cancel_grace: Duration = Field(
        timedelta(seconds=10),
        description="Time between the polite stop (SIGTERM) and the forced one (SIGKILL).",
    )
    dispatch_interval: Duration = Field(
        timedelta(seconds=1),
        description="How often the dispatcher claims when the queue was empty.",
    )
    observe_interval: Duration = Field(
        timedelta(seconds=2), description="How often the dispatcher polls running attempts."
    )


class RetrySettings(BaseModel):
    """How failed jobs are retried (backoff with full jitter)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: Duration = Field(timedelta(seconds=1), description="The first retry waits up to this.")
    cap: Duration = Field(timedelta(minutes=5), description="No retry waits longer than this.")
    seed: int | None = Field(
        None,
        description="Seed for the jitter, for tests and replays only: every process with the"
        " same seed draws the same delays, which undoes the jitter between them.",
    )


class ProcessExecutorSettings(BaseModel):
    """The embedded `process` executor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    root: Path | None = Field(None, description="Run folders live here; default <state_dir>/runs.")


class ExecutorSettings(BaseModel):
    """Which executors this corral runs, and their settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: tuple[str, ...] = Field(("process",), description="Executor kinds to run.")
    process: ProcessExecutorSettings = ProcessExecutorSettings()


_DB_SCHEMES = re.compile(r"^(sqlite|postgresql(\+psycopg)?)://")


class Settings(BaseSettings):
    """Everything corral can be told. Read with Settings.load()."""

    model_config = SettingsConfigDict(
        env_prefix="CORRAL_", env_nested_delimiter="__", extra="forbid", frozen=True
    )
    _toml_file: ClassVar[Path | None] = None
    _check_chain: ClassVar[bool] = True

    database_url: str = Field("sqlite:///./corral.db", description="SQLite file or PostgreSQL URL.")
    state_dir: Path = Field(Path(".corral"), description="Local state: run folders, logs.")
    claim_batch_limit: int = Field(100, ge=1, le=10_000, description="Most jobs claimed per tick.")
    recovery_batch_limit: int = Field(
        500, ge=1, le=100_000, description="Most attempts one reconciler pass looks at."
    )
    launch_concurrency: int = Field(16, ge=1, le=1_000, description="Launches in flight at once.")
    max_payload_bytes: int = Field(
        1 << 20, ge=1, description="Largest accepted payload (JSON bytes)."
    )
    default_max_attempts: int = Field(
        3, ge=1, le=1_000, description="Attempts a job gets by default."
    )
    api_url: str | None = Field(None, description="Passed to attempts as CORRAL_API_URL.")
    log_level: str = Field("INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")
    timeouts: Timeouts = Timeouts()
    retry: RetrySettings = RetrySettings()
    executors: ExecutorSettings = ExecutorSettings()

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, url: str) -> str:
        if not _DB_SCHEMES.match(url):
            raise ValueError(
                f"{url!r} is not a supported database URL: use sqlite:///PATH or"
                " postgresql+psycopg://USER@HOST:PORT/DB"
            )
        return url

    @model_validator(mode="after")
    def _limits_nest(self) -> Settings:
        if self._check_chain and (broken := chain_violations(self)):
            raise ValueError("; ".join(broken))
        return self

    @property
    def process_root(self) -> Path:
        return self.executors.process.root or self.state_dir / "runs"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls._toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=cls._toml_file))
        return tuple(sources)

    @classmethod
    def load(
        cls, config_file: Path | None = None, *, check_chain: bool = True, **overrides: Any
    ) -> Settings:
        """Read settings from `config_file` (default ./corral.toml if present) and the env.

        `check_chain=False` reads settings whose time limits do not nest, so that `corral
        check` can show what is wrong; everything else refuses them.
        """
        path = config_file if config_file is not None else DEFAULT_CONFIG_FILE
        if config_file is not None and not path.is_file():
            raise errors.ConfigError(f"config file {str(path)!r} does not exist")
        source = type(
            cls.__name__,
            (cls,),
            {"_toml_file": path if path.is_file() else None, "_check_chain": check_chain},
        )
        try:
            settings: Settings = source(**overrides)
            return settings
        except ValidationError as exc:
            raise errors.ConfigError(
                describe(exc, origin=str(path) if path.is_file() else None)
            ) from None
        except (ValueError, OverflowError) as exc:  # TOML syntax, an env value that is not JSON
            raise errors.ConfigError(f"cannot read settings: {exc}") from None


# --- the chain of limits ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Link:
    """One relation of the chain: `inner` (plus `extra`) must stay below `outer`.

    A strict link needs at least `timeouts.margin` to spare; a loose one only `<=`.
    """

    inner: str
    outer: str
    strict: bool
    why: str
    extra: str | None = None


CHAIN = (
    Link(
        "timeouts.attempt_deadline",
        "timeouts.recovery_grace",
        strict=True,
        extra="timeouts.cancel_grace",
        why="an attempt still being stopped at its deadline must not be taken for lost"
        " and launched a second time",
    ),
    Link(
        "timeouts.lease_timeout",
        "timeouts.recovery_grace",
        strict=False,
        why="recovery must look at a quiet attempt before it may call it lost",
    ),
    Link(
        "claim_batch_limit",
        "recovery_batch_limit",
        strict=False,
        why="one reconciler pass must be able to repair every attempt of a tick that failed"
        " half-way",
    ),
)


@dataclass(frozen=True, slots=True)
class LinkCheck:
    """A link of the chain with this configuration's values, in whole units (microseconds
    for durations, so that a limit that meets the rule exactly is not refused by rounding)."""

    link: Link
    inner: int
    extra: int
    outer: int
    needed: int  # the margin for a strict link, else 0

    @property
    def spare(self) -> int:
        return self.outer - self.inner - self.extra

    @property
    def ok(self) -> bool:
        return self.spare >= self.needed

    def show(self, units: int) -> str:
        """`units` as a person reads them: seconds for time limits, counts otherwise."""
        if self.link.inner.startswith("timeouts."):
            return f"{units / 1_000_000:g}s"
        return f"{units:g}"


def chain(settings: Settings) -> list[LinkCheck]:
    """Every link of the chain, with this configuration's values."""
    margin = _units(settings, "timeouts.margin")
    return [
        LinkCheck(
            link,
            inner=_units(settings, link.inner),
            extra=_units(settings, link.extra) if link.extra else 0,
            outer=_units(settings, link.outer),
            needed=margin if link.strict else 0,
        )
        for link in CHAIN
    ]


def chain_violations(settings: Settings) -> list[str]:
    """One message per broken link, naming both settings, their values and the margin."""
    out = []
    for c in chain(settings):
        if c.ok:
            continue
        link = c.link
        inner = f"{link.inner} ({c.show(c.inner)})"
        if link.extra:
            inner += f" + {link.extra} ({c.show(c.extra)})"
        rule = (
            f"at least {c.show(c.needed)} (timeouts.margin) less than" if link.strict else "at most"
        )
        out.append(f"{inner} must be {rule} {link.outer} ({c.show(c.outer)}): {link.why}")
    return out


def _units(settings: Settings, dotted: str) -> int:
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value // timedelta(microseconds=1) if isinstance(value, timedelta) else int(value)


def describe(exc: ValidationError, *, origin: str | None = None) -> str:
    """One line per broken setting: `setting: what is wrong`."""
    lines = []
    for err in exc.errors():
        name = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        lines.append(f"{name}: {msg}" if name else msg)
    where = f" (from {origin} and CORRAL_* environment)" if origin else ""
    return f"invalid settings{where}: " + "; ".join(lines)
