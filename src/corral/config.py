"""Settings: one validated object read from `corral.toml` and `CORRAL_*` environment variables.

Environment variables win over the file; nested settings use a double underscore
(`CORRAL_TIMEOUTS__ATTEMPT_DEADLINE=240`). Durations accept seconds or `500ms`, `90s`,
`4m`, `1h`, `1h30m` (corral.durations). Unknown keys and bad values raise ConfigError
naming the setting.

The groups that have a home of their own are read from it: the chain of time limits from
corral.timeouts, alerts from corral.alert_settings; a job's own policy, which is not a
setting, lives in corral.policy.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from corral import (
    alert_settings,
    durations,
    entrypoints,
    errors,
    failpoints,
    launching,
    shares,
    tenancy,
    timeouts,
)
from corral.proxies import ApiSettings
from corral.tenancy import TenantSettings
from corral.timeouts import Timeouts

if TYPE_CHECKING:  # corral's own executors' tables, as the type checker sees them
    from corral.executors import http_settings, kubernetes_settings, process_settings

DEFAULT_CONFIG_FILE = Path("corral.toml")


class BudgetSettings(BaseModel):
    """A retry budget per queue: a token bucket that retries draw from, so a failure of
    everything at once does not become a storm of retries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ratio: float = Field(
        0.2, ge=0.0, le=10.0, description="Tokens each first attempt in the queue adds."
    )
    floor_per_minute: float = Field(
        10.0, gt=0.0, le=1_000_000.0, description="Tokens added per minute whatever the traffic."
    )
    burst: float = Field(100.0, ge=1.0, le=1_000_000.0, description="The most tokens kept.")


class RetrySettings(BaseModel):
    """How failed jobs are retried (backoff with full jitter), and when they stop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quarantine_after: int = Field(
        2,
        ge=1,
        le=100,
        description="Quarantine a job after this many consecutive attempts fail the same way.",
    )
    budget: BudgetSettings = BudgetSettings()
    base: durations.Duration = Field(
        timedelta(seconds=1), description="The first retry waits up to this."
    )
    cap: durations.Duration = Field(
        timedelta(minutes=5), description="No retry waits longer than this."
    )
    seed: int | None = Field(
        None,
        description="Seed for the jitter, for tests and replays only: every process with the"
        " same seed draws the same delays, which undoes the jitter between them.",
    )


class RetentionSettings(BaseModel):
    """How long what corral records is kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    jobs: durations.Duration = Field(
        timedelta(days=30),
        description="A job that succeeded, failed or was cancelled is removed, with its"
        " attempts, events and run logs, this long after it finished (by the reconciler)."
        " Quarantined jobs wait for a person and are kept.",
    )

    @field_validator("jobs")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be longer than zero")
        return value


class SecretsSettings(BaseModel):
    """The secrets HTTP requests are signed with (`corral secrets`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rotation_overlap: durations.Duration = Field(
        timedelta(hours=24),
        description="After a rotation, how long the previous secret signs alongside the new"
        " one, so receivers can move to the new one at their own pace.",
    )


class ExecutorSettings(BaseModel):
    """Which executors this corral runs, and each one's table, `[executors.<kind>]`.

    A table is read with the model the executor's registration names
    (`Registration.settings_model`, see corral.executors.registry), so an executor brings its
    settings with it and adding one touches nothing here. An executor without a model keeps
    its table as given, read with `section(kind)`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    enabled: tuple[str, ...] = Field(
        ("process", "http"),
        description="Executor kinds to run, from the registered ones (`corral.executors`"
        " entry points; corral's own: process, http, kubernetes, argo).",
    )

    if TYPE_CHECKING:  # at run time these are read through the registry (`with_tables`)

        @property
        def process(self) -> process_settings.ProcessExecutorSettings: ...
        @property
        def http(self) -> http_settings.HttpExecutorSettings: ...
        @property
        def kubernetes(self) -> kubernetes_settings.KubernetesExecutorSettings: ...

    @field_validator("enabled")
    @classmethod
    def _registered(cls, enabled: tuple[str, ...]) -> tuple[str, ...]:
        known = entrypoints.names(entrypoints.EXECUTORS)
        if unknown := [kind for kind in enabled if kind not in known]:
            raise ValueError(
                f"unknown executor {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
            )
        if len(set(enabled)) != len(enabled):
            raise ValueError("an executor is named twice")
        return enabled

    @model_validator(mode="after")
    def _sections_are_executors(self) -> ExecutorSettings:
        known = entrypoints.names(entrypoints.EXECUTORS)
        for name in self.model_extra or {}:
            if name not in known:
                raise ValueError(
                    f"{name}: unknown setting (not a registered executor;"
                    f" known: {', '.join(known)})"
                )
        return self

    @classmethod
    def with_tables(cls) -> type[ExecutorSettings]:
        """This model with a field for each registered executor that names a settings
        model: its table, every setting at its default when the table is not given."""
        return _with_tables(_settings_models())

    def section(self, kind: str) -> Mapping[str, Any]:
        """The `[executors.<kind>]` table of an executor without a settings model (empty
        if unset)."""
        found = (self.model_extra or {}).get(kind, {})
        return found if isinstance(found, Mapping) else {}

    @property
    def pods(self) -> bool:
        """Whether an enabled executor runs its attempts in pods (its registration says
        `container`): the links of the chain about pods then apply."""
        return any(getattr(_registration(kind), "container", False) for kind in self.enabled)


def _registration(kind: str) -> Any:
    """The registration of `kind` (corral.executors.registry.Registration), or None when it
    cannot be loaded: an executor that is not enabled does not stop settings from loading,
    and one that is says what is wrong when it is built. Read from the entry-point table,
    since the registry sits above settings."""
    try:
        return entrypoints.load(entrypoints.EXECUTORS, kind)
    except errors.ConfigError:
        return None


@functools.cache
def _settings_models() -> tuple[tuple[str, type[BaseModel]], ...]:
    """The settings model of each registered executor that names one, by kind (read once:
    the registry does not change while corral runs)."""
    found = {}
    for kind in entrypoints.names(entrypoints.EXECUTORS):
        made = getattr(_registration(kind), "settings_model", None)
        if isinstance(made, type) and issubclass(made, BaseModel):
            found[kind] = made
    return tuple(sorted(found.items()))


@functools.cache
def _with_tables(models: tuple[tuple[str, type[BaseModel]], ...]) -> type[ExecutorSettings]:
    fields: dict[str, Any] = {kind: (made, made()) for kind, made in models}
    return create_model(
        "ExecutorSettings",
        __base__=ExecutorSettings,
        __module__=__name__,
        __doc__=ExecutorSettings.__doc__,
        **fields,
    )


if TYPE_CHECKING:
    ExecutorTables = ExecutorSettings
    """At run time: ExecutorSettings with every registered executor's table (`with_tables`),
    resolved when Settings is first used (`Settings.model_rebuild`)."""

_POOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_DB_SCHEMES = re.compile(r"^(sqlite|postgresql(\+psycopg)?)://")


@functools.lru_cache(maxsize=16)
def _url_for_jobs(url: str, cwd: str) -> str:
    prefix = "sqlite:///"
    path = url.removeprefix(prefix)
    if url.startswith(prefix) and not path.startswith(("/", ":memory:")):
        return prefix + os.path.join(cwd, path)
    return url


class Settings(BaseSettings):
    """Everything corral can be told. Read with Settings.load()."""

    model_config = SettingsConfigDict(
        env_prefix="CORRAL_", env_nested_delimiter="__", extra="forbid", frozen=True
    )
    _toml_file: ClassVar[Path | None] = None
    _check_chain: ClassVar[bool] = True
    _attempts_served: bool = PrivateAttr(False)
    """This process answers the attempt API on `attempt_socket` (see `serving_attempts`)."""

    database_url: str = Field("sqlite:///./corral.db", description="SQLite file or PostgreSQL URL.")
    state_dir: Path = Field(Path(".corral"), description="Local state: run folders, logs.")
    claim_batch_limit: int = Field(100, ge=1, le=10_000, description="Most jobs claimed per tick.")
    pools: dict[str, int] = Field(
        default_factory=dict,
        description="Named pools and their slots: at most that many of a pool's jobs run at"
        " once (e.g. backfill = 2). A job names its pool; jobs without one are not capped.",
    )
    tenants: dict[str, TenantSettings] = Field(
        default_factory=dict,
        description='Per tenant (`[tenants.NAME]`; `[tenants."*"]` for every tenant not'
        " named): max_running, the most of its jobs that run at once, checked at the claim as"
        " pools are; executors, what its tokens and dashboard users may submit and schedule"
        ' (default ["http", "python"]).',
    )
    recovery_batch_limit: int = Field(
        500, ge=1, le=100_000, description="Most attempts one reconciler pass looks at."
    )
    operation_batch_limit: int = Field(
        200,
        ge=1,
        le=10_000,
        description="Most jobs of a bulk operation changed in one transaction (one step).",
    )
    launch_concurrency: int = Field(16, ge=1, le=1_000, description="Launches in flight at once.")
    max_payload_bytes: int = Field(
        1 << 20, ge=1, description="Largest accepted payload (JSON bytes)."
    )
    default_max_attempts: int = Field(
        3, ge=1, le=1_000, description="Attempts a job gets by default."
    )
    public_url: str | None = Field(
        None,
        description="The URL people and other servers reach corral's API and dashboard at"
        " (e.g. https://corral.example.com): the base of monitors' ping URLs and of every link"
        " in an alert. alerts.base_url is its deprecated alias.",
    )
    api_url: str | None = Field(
        None,
        description="Where jobs reach corral's API: passed to attempts as CORRAL_API_URL with"
        " an attempt token (CORRAL_ATTEMPT_TOKEN) in place of the database's URL.",
    )
    attempt_key: str | None = Field(
        None,
        repr=False,
        min_length=32,
        description="The key attempt tokens are signed with. Unset: made once and kept in the"
        " store, shared by every corral process on it.",
    )
    jobs_get_database_url: bool = Field(
        False,
        description="Pass database_url to the operator's process jobs as CORRAL_DATABASE_URL"
        " (and executors.kubernetes.database_url_secret to pods). Off: jobs reach corral"
        " through the attempt API only (api_url, or for process jobs the Unix socket their"
        " dispatcher answers), holding a token good for their own attempt. Never passed"
        " with api_url, nor to a tenant's process jobs.",
    )
    log_level: str = Field(
        "INFO",
        pattern=r"^(DEBUG|INFO|WARNING|ERROR)$",
        description="How much corral's loops log: DEBUG, INFO, WARNING or ERROR.",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="How corral's loops log to standard error: text (drawn on a terminal, a"
        " plain line a record to a file or pipe) or json (one JSON object a line). URLs in"
        " every record are redacted.",
    )
    health_file: Path | None = Field(
        None,
        description="When set, the dispatcher and reconciler loops note every finished tick"
        " and pass in this file, for `corral health` (e.g. Kubernetes exec probes).",
    )
    api: ApiSettings = ApiSettings()
    timeouts: Timeouts = Timeouts()
    retry: RetrySettings = RetrySettings()
    secrets: SecretsSettings = SecretsSettings()
    retention: RetentionSettings = RetentionSettings()
    alerts: alert_settings.AlertsSettings = alert_settings.AlertsSettings()
    executors: ExecutorTables = Field(default_factory=lambda: ExecutorSettings.with_tables()())

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, url: str) -> str:
        if not _DB_SCHEMES.match(url):
            raise ValueError(
                f"{url!r} is not a supported database URL: use sqlite:///PATH or"
                " postgresql+psycopg://USER@HOST:PORT/DB"
            )
        if url.startswith("sqlite:"):
            path = url.split("://", 1)[1].removeprefix("/").partition("?")[0]
            if path in ("", ":memory:"):
                raise ValueError(
                    f"{url!r} is an in-memory SQLite database, which corral's connections and"
                    " processes cannot share: give a file, e.g. sqlite:///./corral.db"
                )
        return url

    @field_validator("public_url")
    @classmethod
    def _public(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^https?://[^/\s]+(/\S*)?$", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return None if url is None else url.rstrip("/")

    @field_validator("pools")
    @classmethod
    def _pool_slots(cls, pools: dict[str, int]) -> dict[str, int]:
        for name, slots in pools.items():
            if not _POOL_NAME.match(name):
                raise ValueError(f"pool {name!r}: a name is 1-200 characters of [A-Za-z0-9_.-]")
            if not 1 <= slots <= 100_000:
                raise ValueError(f"pool {name!r}: slots must be between 1 and 100000, not {slots}")
        return pools

    @model_validator(mode="after")
    def _grants(self) -> Settings:
        broken = tenancy.violations(
            self.tenants,
            enabled=self.executors.enabled,
            strangers=self.executors.process.strangers,
            namespaces=self.executors.kubernetes.namespaces_allowed,
        )
        if broken:
            raise ValueError("; ".join(broken))
        return self

    @model_validator(mode="after")
    def _limits_nest(self) -> Settings:
        if self._check_chain and (broken := timeouts.chain_violations(self)):
            raise ValueError("; ".join(broken))
        return self

    @property
    def pod_start_timeout(self) -> timedelta:
        """executors.kubernetes.pod_start_timeout, or, unset, as long as the attempt deadline
        leaves room for (see KubernetesExecutorSettings.start_timeout)."""
        return self.executors.kubernetes.start_timeout(self.timeouts)

    @property
    def public_base(self) -> str | None:
        """Where corral is reached from outside: public_url, else the deprecated
        alerts.base_url; None when neither is set."""
        base = self.public_url or self.alerts.base_url
        return None if base is None else base.rstrip("/")

    @property
    def database_url_for_jobs(self) -> str | None:
        """database_url as a job sees it: a relative SQLite path made absolute, since a job
        runs in a folder of its own."""
        if not self.jobs_get_database_url or self.api_url:
            return None
        return _url_for_jobs(self.database_url, os.getcwd())

    @property
    def settings_file(self) -> Path | None:
        """The TOML file these settings were read from, if any (Settings.load)."""
        found = type(self)._toml_file
        return None if found is None else found.absolute()

    @property
    def attempt_socket(self) -> Path:
        """Where a dispatcher answers its process jobs' attempt API when api_url is unset: in
        a folder of its own, which a sandbox shows whole (a socket made anew after a restart
        is then seen by the commands that run on)."""
        return self.state_dir.absolute() / "attempt-api" / "attempts.sock"

    def serving_attempts(self) -> Settings:
        """These settings, in a process that answers the attempt API on `attempt_socket`:
        its process jobs then get CORRAL_API_URL naming it (see `local_api_url`)."""
        made = self.model_copy()
        made._attempts_served = True
        return made

    @property
    def local_api_url(self) -> str | None:
        """CORRAL_API_URL for this process's process jobs when api_url is unset: the Unix
        socket it answers on, if it does."""
        return f"unix:{self.attempt_socket}" if self._attempts_served else None

    @property
    def sqlite_file(self) -> Path | None:
        """The SQLite database's file, as database_url names it; None for PostgreSQL."""
        url = self.database_url
        if not url.startswith("sqlite:"):
            return None
        return Path(url.split("://", 1)[1].removeprefix("/").partition("?")[0])

    @property
    def process_root(self) -> Path:
        return self.executors.process.root or self.state_dir / "runs"

    @property
    def tenant_caps(self) -> dict[str, int]:
        """The tenants with a max_running, and it."""
        return {
            name: t.max_running for name, t in self.tenants.items() if t.max_running is not None
        }

    @property
    def tenant_weights(self) -> shares.Weights:
        """Each tenant's weight in the claims' fair shares (`[tenants.NAME] weight`)."""
        return tenancy.weights(self.tenants)

    def __init__(self, **values: Any) -> None:
        type(self).model_rebuild()  # before the sources read the fields: see model_rebuild
        super().__init__(**values)

    @classmethod
    def model_rebuild(
        cls,
        *,
        force: bool = False,
        raise_errors: bool = True,
        _parent_namespace_depth: int = 2,
        _types_namespace: Mapping[str, Any] | None = None,
    ) -> bool | None:
        """Builds the model when it is first used: `executors` is ExecutorSettings with each
        registered executor's table (`ExecutorSettings.with_tables`), known only once the
        registry is read, which importing corral.config does not do."""
        tables = {"ExecutorTables": ExecutorSettings.with_tables(), **(_types_namespace or {})}
        return super().model_rebuild(
            force=force,
            raise_errors=raise_errors,
            _parent_namespace_depth=_parent_namespace_depth,
            _types_namespace=tables,
        )

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
        if misspelt := misspelt_variables(os.environ):
            raise errors.ConfigError("; ".join(misspelt))
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


# --- environment variables -----------------------------------------------------------------

NOT_SETTINGS = frozenset({*launching.ATTEMPT_ENV, failpoints.ENV, "CORRAL_CHAOS_SEED"})
"""CORRAL_* variables that are not settings: what corral gives attempts, its failpoints,
and its own tests' (as is every CORRAL_TEST_* variable)."""


def misspelt_variables(env: Mapping[str, str]) -> list[str]:
    """One message per CORRAL_* variable that is not a setting but is close to the name of
    one (a typo would otherwise be ignored, and its setting silently left at its default).
    Variables not close to any setting are left alone: they may be someone else's."""
    Settings.model_rebuild()  # the executors' tables are settings too
    fields = Settings.model_fields
    top = {f"CORRAL_{name.upper()}" for name in fields}
    groups = {
        f"CORRAL_{name.upper()}"
        for name, f in fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    }
    found = []
    for var in sorted(env):
        if not var.startswith("CORRAL_") or var in NOT_SETTINGS or var.startswith("CORRAL_TEST_"):
            continue
        head, nested, rest = var.partition("__")
        if var in top or (nested and head in groups):
            continue  # a setting (a nested one's own name is checked by the model)
        near = difflib.get_close_matches(head, groups if nested else top | NOT_SETTINGS, 1, 0.8)
        if near and (near[0] in top or nested):
            meant = f"{near[0]}__{rest}" if nested else near[0]
            found.append(f"{var} is not a setting: did you mean {meant}?")
    return found


def describe(
    exc: ValidationError, *, origin: str | None = None, what: str = "settings", prefix: str = ""
) -> str:
    """One line per broken setting: `setting: what is wrong`."""
    lines = []
    for err in exc.errors():
        name = ".".join([prefix.rstrip(".")] * bool(prefix) + [str(p) for p in err["loc"]])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting" if what == "settings" else "unknown field"
        lines.append(f"{name}: {msg}" if name else msg)
    where = f" (from {origin} and CORRAL_* environment)" if origin else ""
    return f"invalid {what}{where}: " + "; ".join(lines)
