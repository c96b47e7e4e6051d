"""Settings: durations, the TOML file, CORRAL_* variables, and errors that name the setting."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import durations, errors, policy
from corral.config import Settings
from corral.durations import parse_duration
from corral.testing import assert_timeouts_nest
from corral.timeouts import chain


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (90, 90),
        (1.5, 1.5),
        ("90", 90),
        ("90s", 90),
        ("4m", 240),
        ("1h", 3600),
        ("1h30m", 5400),
        ("500ms", 0.5),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "4x", "-3", 0, "m", True, "1 h"])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.fixture(autouse=True)
def _no_corral_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for key in (
        "CORRAL_DATABASE_URL",
        "CORRAL_TIMEOUTS__ATTEMPT_DEADLINE",
        "CORRAL_CLAIM_BATCH_LIMIT",
    ):
        monkeypatch.delenv(key, raising=False)


def test_defaults_are_the_embedded_setup() -> None:
    s = Settings.load()
    assert s.database_url == "sqlite:///./corral.db"
    assert s.executors.enabled == ("process", "http")
    assert s.process_root == Path(".corral/runs")


def test_toml_file_then_env_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'claim_batch_limit = 7\n[timeouts]\nattempt_deadline = "90s"\ncancel_grace = 3\n'
    )
    s = Settings.load(cfg)
    assert (s.claim_batch_limit, s.timeouts.attempt_deadline, s.timeouts.cancel_grace) == (
        7,
        timedelta(seconds=90),
        timedelta(seconds=3),
    )
    monkeypatch.setenv("CORRAL_TIMEOUTS__ATTEMPT_DEADLINE", "4m")
    monkeypatch.setenv("CORRAL_CLAIM_BATCH_LIMIT", "9")
    s = Settings.load(cfg)
    assert (s.claim_batch_limit, s.timeouts.attempt_deadline) == (9, timedelta(minutes=4))


def test_corral_toml_in_the_working_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "corral.toml").write_text("claim_batch_limit = 3\n")
    assert Settings.load().claim_batch_limit == 3


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ("claim_batch_limt = 3\n", "claim_batch_limt: unknown setting"),
        ("[timeouts]\nattempt_deadlin = 3\n", "timeouts.attempt_deadlin: unknown setting"),
        (
            '[timeouts]\nattempt_deadline = "soon"\n',
            "timeouts.attempt_deadline: 'soon' is not a duration",
        ),
        (
            "claim_batch_limit = 0\n",
            "claim_batch_limit: Input should be greater than or equal to 1",
        ),
        (
            'database_url = "mysql://x"\n',
            "database_url: 'mysql://x' is not a supported database URL",
        ),
        ("claim_batch_limit = \n", "cannot read settings"),
    ],
)
def test_bad_settings_name_the_setting(tmp_path: Path, toml: str, named: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    with pytest.raises(errors.ConfigError, match=named.replace("(", r"\(")):
        Settings.load(cfg)


def test_bad_env_value_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TIMEOUTS__ATTEMPT_DEADLINE", "4x")
    with pytest.raises(errors.ConfigError, match="timeouts.attempt_deadline"):
        Settings.load()


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="does not exist"):
        Settings.load(tmp_path / "nope.toml")


# --- the chain of limits -------------------------------------------------------------------

millis = st.integers(min_value=1, max_value=10_000_000)  # durations in whole milliseconds
gaps = st.integers(min_value=0, max_value=1_000_000)
LIMITS = (
    "http_request_timeout",
    "step_deadline",
    "attempt_deadline",
    "cancel_grace",
    "recovery_grace",
    "heartbeat_interval",
    "lease_timeout",
    "tick_deadline",
    "dispatch_interval",
    "launch_grace",
    "margin",
    "tick_margin",
)


@st.composite
def nesting_limits(draw: st.DrawFn) -> dict[str, int]:
    """Limits that nest by construction: each outer one is its inner one plus the margin
    plus a gap (zero included: the boundary)."""
    m, tm = draw(millis), draw(millis)
    http = draw(millis)
    step = http + m + draw(gaps)
    attempt = step + m + draw(gaps)
    cancel = draw(millis)
    heartbeat = draw(millis)
    lease = heartbeat + m + draw(gaps)
    recovery = max(attempt + cancel + m, lease) + draw(gaps)
    tick = draw(millis)
    return {
        "http_request_timeout": http,
        "step_deadline": step,
        "attempt_deadline": attempt,
        "cancel_grace": cancel,
        "recovery_grace": recovery,
        "heartbeat_interval": heartbeat,
        "lease_timeout": lease,
        "tick_deadline": tick,
        "dispatch_interval": tick + tm + draw(gaps),
        "launch_grace": tick + tm + draw(gaps),
        "margin": m,
        "tick_margin": tm,
    }


@st.composite
def batch_limits(draw: st.DrawFn) -> tuple[int, int]:
    """(claim_batch_limit, recovery_batch_limit): as often around the rule (recovery at
    least twice the claim) as anywhere."""
    claim = draw(st.integers(1, 10_000))
    recovery = draw(
        st.one_of(
            st.integers(1, 100_000),
            st.integers(max(1, 2 * claim - 2), 2 * claim + 2),
        )
    )
    return claim, recovery


@given(
    ms=st.one_of(nesting_limits(), st.fixed_dictionaries({name: millis for name in LIMITS})),
    batches=batch_limits(),
)
def test_the_chain_accepts_exactly_the_nesting_settings(
    ms: dict[str, int], batches: tuple[int, int]
) -> None:
    claim, recovery_batch = batches
    m, tm = ms["margin"], ms["tick_margin"]
    nests = (
        ms["http_request_timeout"] + m <= ms["step_deadline"]
        and ms["step_deadline"] + m <= ms["attempt_deadline"]
        and ms["attempt_deadline"] + ms["cancel_grace"] + m <= ms["recovery_grace"]
        and ms["heartbeat_interval"] + m <= ms["lease_timeout"]
        and ms["lease_timeout"] <= ms["recovery_grace"]
        and ms["tick_deadline"] + tm <= ms["dispatch_interval"]
        and ms["tick_deadline"] + tm <= ms["launch_grace"]
        and 2 * claim <= recovery_batch
    )
    overrides = {
        "timeouts": {name: f"{value}ms" for name, value in ms.items()},
        "claim_batch_limit": claim,
        "recovery_batch_limit": recovery_batch,
    }
    if nests:
        Settings.load(None, **overrides)
        assert_timeouts_nest(Settings.load(None, **overrides))
    else:
        with pytest.raises(errors.ConfigError, match="must be"):
            Settings.load(None, **overrides)
        with pytest.raises(AssertionError, match="do not nest"):
            assert_timeouts_nest(Settings.load(None, check_chain=False, **overrides))


def test_one_recovery_pass_must_cover_two_claims() -> None:
    """2 x claim_batch_limit <= recovery_batch_limit: a reconciler pass repairs what a
    dispatcher's two claims (the one launching and the one made ahead) left."""
    with pytest.raises(errors.ConfigError, match="recovery_batch_limit"):
        Settings.load(None, claim_batch_limit=100, recovery_batch_limit=199)
    assert Settings.load(None, claim_batch_limit=100, recovery_batch_limit=200)


def test_unset_inner_limits_follow_their_outer_limit_down() -> None:
    t = Settings.load(None, timeouts={"attempt_deadline": "90s", "dispatch_interval": "300ms"})
    assert t.timeouts.step_deadline == timedelta(seconds=85)
    assert t.timeouts.http_request_timeout == timedelta(seconds=30)  # its default still fits
    assert t.timeouts.tick_deadline == timedelta(milliseconds=200)
    # A limit that is set is never moved: it is checked.
    with pytest.raises(errors.ConfigError, match="timeouts.step_deadline \\(100s\\)"):
        Settings.load(None, timeouts={"attempt_deadline": "90s", "step_deadline": "100s"})


def test_a_broken_link_names_both_settings_their_values_and_the_margin() -> None:
    with pytest.raises(errors.ConfigError) as caught:
        Settings.load(None, timeouts={"attempt_deadline": 350, "recovery_grace": 360})
    assert str(caught.value) == (
        "invalid settings: timeouts.attempt_deadline (350s) + timeouts.cancel_grace (10s) must be"
        " at least 5s (timeouts.margin) less than timeouts.recovery_grace (360s): an attempt still"
        " being stopped at its deadline must not be taken for lost and launched a second time"
    )


def test_assert_timeouts_nest_reads_the_config_file(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text('[timeouts]\nattempt_deadline = "4m"\nrecovery_grace = "6m"\n')
    bad.write_text('[timeouts]\nlease_timeout = "10m"\nrecovery_grace = "6m"\n')
    assert_timeouts_nest(config_file=good)
    with pytest.raises(AssertionError, match="timeouts.lease_timeout \\(600s\\) must be at most"):
        assert_timeouts_nest(config_file=bad)


def test_limits_that_meet_the_rule_exactly_are_accepted() -> None:
    # 0.1 + 0.1 + 0.1 is not 0.3 in floating point; the check counts whole microseconds.
    exact = {
        "recovery_grace": 0.5,
        "attempt_deadline": 0.3,
        "step_deadline": 0.2,
        "http_request_timeout": 0.1,
        "cancel_grace": 0.1,
        "margin": 0.1,
        "lease_timeout": 0.5,
        "heartbeat_interval": 0.4,
    }
    Settings.load(None, timeouts=exact)


def test_jobs_get_an_absolute_database_url_unless_told_not_to(tmp_path: Path) -> None:
    import os

    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        told = {"jobs_get_database_url": True}
        relative = Settings.load(None, database_url="sqlite:///./corral.db", **told)
        assert relative.database_url_for_jobs == f"sqlite:///{tmp_path}/./corral.db"
        pg = "postgresql+psycopg://corral@db:5432/corral"
        assert Settings.load(None, database_url=pg, **told).database_url_for_jobs == pg
        assert Settings.load(None).database_url_for_jobs is None  # by default: never
    finally:
        os.chdir(here)


# --- a job's own limits --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deadline", "step", "http"),
    [("5s", 2.5, 1.25), ("1s", 0.5, 0.25), ("10s", 5.0, 2.5), ("12s", 7.0, 3.5), ("90s", 85, 30)],
)
def test_a_jobs_deadline_shrinks_the_inner_limits_it_leaves_unset(
    deadline: str, step: float, http: float
) -> None:
    limits = policy.job_policy(Settings(), {"limits": {"attempt_deadline": deadline}}).limits
    assert limits.step_deadline == timedelta(seconds=step)
    assert (limits.http_request_timeout or Settings().timeouts.http_request_timeout) == (
        timedelta(seconds=http)
    )


def test_a_jobs_own_inner_limit_that_does_not_fit_is_refused() -> None:
    with pytest.raises(errors.InvalidInput, match=r"step_deadline \(4s\) must be at least 2.5s"):
        policy.job_policy(Settings(), {"limits": {"attempt_deadline": "5s", "step_deadline": "4s"}})


# --- CORRAL_* variables and database URLs ---------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("CORRAL_DATABSE_URL", "CORRAL_DATABASE_URL"),
        ("CORRAL_CLAIM_BATCH_LIMT", "CORRAL_CLAIM_BATCH_LIMIT"),
        ("CORRAL_TIMEOUT__ATTEMPT_DEADLINE", "CORRAL_TIMEOUTS__ATTEMPT_DEADLINE"),
    ],
)
def test_a_misspelt_variable_is_refused_with_the_setting_it_looks_like(
    monkeypatch: pytest.MonkeyPatch, variable: str, meant: str
) -> None:
    monkeypatch.setenv(variable, "1")
    with pytest.raises(
        errors.ConfigError, match=f"{variable} is not a setting: did you mean {meant}?"
    ):
        Settings.load()


@pytest.mark.parametrize(
    "variable",
    [
        "CORRAL_JOB_ID",
        "CORRAL_FENCE",
        "CORRAL_FAILPOINTS",
        "CORRAL_RUN_DIR",
        "CORRAL_TEST_URL",
        "CORRAL_HOME",
    ],
)
def test_what_corral_gives_attempts_and_tests_is_not_taken_for_a_typo(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "1" if variable != "CORRAL_FAILPOINTS" else "")
    assert Settings.load()


def test_a_nested_unknown_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TIMEOUTS__ATTEMP_DEADLINE", "5")
    with pytest.raises(errors.ConfigError, match="timeouts.attemp_deadline: unknown setting"):
        Settings.load()


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:///:memory:", "sqlite://"])
def test_an_in_memory_sqlite_database_is_refused(url: str) -> None:
    with pytest.raises(errors.ConfigError, match="in-memory SQLite database.*give a file"):
        Settings.load(database_url=url)


def test_only_registered_executors_can_be_enabled(tmp_path: Path) -> None:
    (tmp_path / "corral.toml").write_text('[executors]\nenabled = ["process", "nomad"]\n')
    with pytest.raises(
        errors.ConfigError, match="unknown executor 'nomad'; known: argo, http, kubernetes, process"
    ):
        Settings.load(tmp_path / "corral.toml", check_chain=False)
    (tmp_path / "corral.toml").write_text('[executors.nomad]\naddress = "x"\n')
    with pytest.raises(errors.ConfigError, match="nomad: unknown setting"):
        Settings.load(tmp_path / "corral.toml")


# --- the database's limits (PostgreSQL) ------------------------------------------------------

PG = "postgresql+psycopg://corral@127.0.0.1:5432/corral"


def test_database_limits_have_defaults_that_nest_inside_the_tick_and_lease_limits() -> None:
    t = Settings.load(None, database_url=PG).timeouts
    seconds = {
        name: getattr(t, f"database_{name}").total_seconds()
        for name in (
            "wait",
            "connect_timeout",
            "tcp_timeout",
            "lock_timeout",
            "statement_timeout",
            "idle_timeout",
            "transaction_timeout",
        )
    }
    assert seconds == {
        "wait": 300,
        "connect_timeout": 5,
        "tcp_timeout": 10,
        "lock_timeout": 2,
        "statement_timeout": 10,
        "idle_timeout": 10,
        "transaction_timeout": 20,
    }
    assert (t.launch_grace, t.lease_timeout) == (timedelta(seconds=30), timedelta(seconds=60))
    links = {
        (c.link.inner, c.link.outer, c.link.extra): c
        for c in chain(Settings.load(None, database_url=PG))
    }
    for inner in ("lock", "statement", "connect", "tcp", "idle", "transaction"):
        assert any(i == f"timeouts.database_{inner}_timeout" for i, _, _ in links), inner
    assert all(c.ok and (c.applies or c.link.cluster_only) for c in links.values())
    # A job may still have a lease shorter than a store call: the links are corral's own.
    own = policy.job_policy(
        Settings.load(None, database_url=PG), {"limits": {"lease_timeout": "10s"}}
    )
    assert own.limits.lease_timeout == timedelta(seconds=10)


@pytest.mark.parametrize(
    ("timeouts", "message"),
    [
        (
            {"database_lock_timeout": "10s"},
            "timeouts.database_lock_timeout (10s) must be at least 0.1s (timeouts.tick_margin)"
            " less than timeouts.database_statement_timeout (10s): a statement kept waiting for"
            " a lock must fail as a lock wait",
        ),
        (
            {"database_statement_timeout": "20s"},
            "timeouts.database_statement_timeout (20s) must be at least 0.1s"
            " (timeouts.tick_margin) less than timeouts.database_transaction_timeout (20s)",
        ),
        (
            {"database_connect_timeout": "20s"},
            "timeouts.database_connect_timeout (20s) must be at least 0.1s"
            " (timeouts.tick_margin) less than timeouts.database_transaction_timeout (20s)",
        ),
        (
            {"database_tcp_timeout": "30s"},
            "timeouts.database_tcp_timeout (30s) must be at least",
        ),
        (
            {"database_idle_timeout": "1m"},
            "timeouts.database_idle_timeout (60s) must be at least",
        ),
        (
            {"database_transaction_timeout": "30s"},
            "timeouts.database_transaction_timeout (30s) + timeouts.tick_deadline (0.5s) must be"
            " at least 0.1s (timeouts.tick_margin) less than timeouts.launch_grace (30s): a claim"
            " whose answer comes late must be given up, or its attempts launched, before"
            " recovery looks at them",
        ),
        (
            {"database_transaction_timeout": "25s", "lease_timeout": "24s"},
            "timeouts.database_transaction_timeout (25s) must be at most timeouts.lease_timeout"
            " (24s): a write that renews a lease must end, or be given up, within the lease",
        ),
    ],
)
def test_database_limits_that_do_not_nest_are_refused_on_postgresql_only(
    timeouts: dict[str, str], message: str
) -> None:
    with pytest.raises(errors.ConfigError, match=re.escape(message)):
        Settings.load(None, database_url=PG, timeouts=timeouts)
    # SQLite uses none of these limits: they are not checked there.
    assert Settings.load(None, timeouts=timeouts).timeouts.model_dump()
    with pytest.raises(AssertionError, match=re.escape(message)):
        assert_timeouts_nest(
            Settings.load(None, database_url=PG, check_chain=False, **{"timeouts": timeouts})
        )


gap = st.integers(min_value=-300, max_value=3_000)  # ms: around the 100ms tick_margin


@given(
    transaction=st.integers(min_value=2_000, max_value=60_000),
    gaps=st.fixed_dictionaries(
        {
            name: gap
            for name in ("lock", "statement", "tcp", "idle", "launch_grace", "lease_timeout")
        }
    ),
    connect=st.integers(2, 60),
)
def test_the_database_links_accept_exactly_the_nesting_settings(
    transaction: int, gaps: dict[str, int], connect: int
) -> None:
    tm, tick = 100, 500  # tick_margin and tick_deadline, in ms (their defaults)
    ms = {
        "database_transaction_timeout": transaction,
        "database_statement_timeout": max(1, transaction - gaps["statement"]),
        "database_lock_timeout": max(1, transaction - gaps["statement"] - gaps["lock"]),
        "database_tcp_timeout": max(1, transaction - gaps["tcp"]),
        "database_idle_timeout": max(1, transaction - gaps["idle"]),
        "launch_grace": transaction + tick + gaps["launch_grace"],
        "lease_timeout": max(5_001, transaction + gaps["lease_timeout"]),
    }
    nests = (
        ms["database_lock_timeout"] + tm <= ms["database_statement_timeout"]
        and ms["database_statement_timeout"] + tm <= transaction
        and connect * 1000 + tm <= transaction
        and ms["database_tcp_timeout"] + tm <= transaction
        and ms["database_idle_timeout"] + tm <= transaction
        and transaction + tick + tm <= ms["launch_grace"]
        and transaction <= ms["lease_timeout"]
    )
    timeouts = {name: f"{value}ms" for name, value in ms.items()}
    timeouts["database_connect_timeout"] = f"{connect}s"
    if nests:
        Settings.load(None, database_url=PG, timeouts=timeouts)
    else:
        with pytest.raises(errors.ConfigError, match="must be"):
            Settings.load(None, database_url=PG, timeouts=timeouts)


def test_unset_database_limits_follow_launch_grace_and_each_other_down() -> None:
    t = Settings.load(None, database_url=PG, timeouts={"launch_grace": "10s"}).timeouts
    assert t.database_transaction_timeout == timedelta(seconds=9.4)  # - tick_deadline, margin
    assert t.database_statement_timeout == timedelta(seconds=9.3)
    assert t.database_lock_timeout == timedelta(seconds=2)  # its default still fits
    assert t.database_idle_timeout == t.database_tcp_timeout == timedelta(seconds=9.3)
    assert t.database_connect_timeout == timedelta(seconds=5)  # its default still fits
    t = Settings.load(None, database_url=PG, timeouts={"launch_grace": "4s"}).timeouts
    assert t.database_transaction_timeout == timedelta(seconds=3.4)
    assert t.database_connect_timeout == timedelta(seconds=3)  # libpq's whole seconds
    with pytest.raises(errors.ConfigError, match=r"timeouts.database_connect_timeout \(5s\)"):
        Settings.load(None, database_url=PG, timeouts={"launch_grace": "2s"})  # 2s at least
    t = Settings.load(
        None, database_url=PG, timeouts={"lease_timeout": "8s", "heartbeat_interval": "2s"}
    ).timeouts
    assert t.database_transaction_timeout == timedelta(seconds=8)
    assert t.database_statement_timeout == timedelta(seconds=7.9)


@pytest.mark.parametrize("value", ["1s", "1500ms", "2.5s", 0.5])
def test_the_connect_timeout_is_whole_seconds_and_at_least_two(value: object) -> None:
    with pytest.raises(
        errors.ConfigError,
        match="timeouts.database_connect_timeout: .*libpq counts it in whole seconds, at least 2",
    ):
        Settings.load(None, timeouts={"database_connect_timeout": value})


def test_durations_are_written_as_people_write_them() -> None:
    shown = [
        durations.format_duration(timedelta(seconds=s)) for s in (0.5, 2.5, 5, 90, 300, 5400, 62.5)
    ]
    assert shown == ["500ms", "2.5s", "5s", "1m30s", "5m", "1h30m", "62.5s"]
    assert all(parse_duration(text) for text in shown)


def test_a_pods_termination_grace_is_in_the_chain_only_with_a_cluster_executor() -> None:
    """A pod stopped at its deadline runs on for its termination grace: recovery must not
    take its attempt for lost before then. Without a cluster executor there are no pods."""
    timeouts = {"attempt_deadline": "4m", "recovery_grace": "6m"}
    slow = {"termination_grace": "2m"}
    with pytest.raises(errors.ConfigError) as caught:
        Settings.load(
            None, timeouts=timeouts, executors={"enabled": ["kubernetes"], "kubernetes": slow}
        )
    said = str(caught.value)
    assert "timeouts.attempt_deadline (240s) + executors.kubernetes.termination_grace" in said
    assert "must have ended before recovery may take its attempt for lost" in said
    Settings.load(None, timeouts=timeouts, executors={"enabled": ["process"], "kubernetes": slow})
