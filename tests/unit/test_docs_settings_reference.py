"""The settings reference (docs/hooks.py) names every setting, and refuses undocumented ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from mkdocs.exceptions import PluginError
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from corral import config

HOOKS = Path(__file__).resolve().parents[2] / "docs" / "hooks.py"


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corral_docs_hooks", HOOKS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    found = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found += leaves(field.annotation, f"{prefix}{name}.")
        else:
            found.append(prefix + name)
    return found


def test_every_setting_is_in_the_reference_with_its_variable(hooks: ModuleType) -> None:
    text = hooks.settings_reference(config.Settings)
    for dotted in leaves(config.Settings):
        assert f"### `{dotted}`" in text
        assert f"`CORRAL_{dotted.upper().replace('.', '__')}`" in text
    assert "### `executors.kubernetes.placements.NAME.tolerations[].effect`" in text
    assert '**default** `"4m"` · **environment** `CORRAL_TIMEOUTS__ATTEMPT_DEADLINE`' in text


class Inner(BaseModel):
    """Inner settings."""

    documented: int = Field(1, description="Has one.")
    bare: int = 2


class Outer(BaseSettings):
    """Outer settings."""

    model_config = SettingsConfigDict(env_prefix="X_", env_nested_delimiter="__")
    inner: Inner = Inner()


def test_a_field_without_a_description_fails_the_build(hooks: ModuleType) -> None:
    with pytest.raises(PluginError, match=r"Inner.bare \(inner.bare\) has no description"):
        hooks.settings_reference(Outer)


def test_the_placeholder_is_replaced_and_other_pages_are_left_alone(hooks: ModuleType) -> None:
    assert hooks.on_page_markdown("# Other\n", page=None) == "# Other\n"
    made = hooks.on_page_markdown(f"# Settings\n\n{hooks.PLACEHOLDER}\n", page=None)
    assert hooks.PLACEHOLDER not in made
    assert "### `database_url`" in made
