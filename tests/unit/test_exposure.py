"""`corral check`'s warnings of jobs that hold corral's secrets, or cannot reach corral."""

from __future__ import annotations

from pathlib import Path

from corral import config
from corral.cli import exposure


def _warned(tmp_path: Path, **given: object) -> list[str]:
    settings = config.Settings(database_url=f"sqlite:///{tmp_path}/corral.db", **given)  # type: ignore[arg-type]
    return exposure.warnings(settings, tmp_path / "absent.toml")


def test_by_default_no_job_holds_the_database(tmp_path: Path) -> None:
    assert _warned(tmp_path) == []


def test_pods_without_api_url_cannot_heartbeat(tmp_path: Path) -> None:
    cluster = {"enabled": ["process", "kubernetes", "argo"], "kubernetes": {"namespace": "j"}}
    [said] = _warned(tmp_path, executors=cluster)
    assert said.startswith("kubernetes and argo jobs cannot heartbeat or checkpoint")
    assert "set api_url" in said
    assert _warned(tmp_path, executors=cluster, api_url="http://corral-api:8080") == []


def test_a_database_secret_handed_to_pods_is_a_warning(tmp_path: Path) -> None:
    cluster = {
        "enabled": ["kubernetes"],
        "kubernetes": {"namespace": "j", "database_url_secret": "corral-db/url"},
    }
    assert _warned(tmp_path, executors=cluster)[0].startswith("kubernetes jobs cannot heartbeat")
    said = _warned(tmp_path, executors=cluster, jobs_get_database_url=True)
    assert len(said) == 2
    assert "pods get the database's URL from the Secret 'corral-db/url'" in said[1]
    assert "process jobs get CORRAL_DATABASE_URL" in said[0]
