"""Schemathesis over the API's own OpenAPI document: requests made from the schema never
get a 5xx, and every answer matches the schema (its status, its content type, its body).
A request the schema allows may still be refused (422) by a rule the schema does not
say (a queue's name, an executor this corral runs): that is not checked here. The app
runs over a SQLite file with an admin token.

Each operation is a test of its own, by its label (e.g. `POST /api/v1/jobs`): the test ids
are unique, so pytest-xdist runs every one of them (schemathesis's own parametrize gives
them one node id, and xdist's grouped distribution then runs only the first)."""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from corral import client, config, store
from corral.api import create_app
from corral.testing import FrozenClock
from tests.support.noop import NoopExecutor

_folder = Path(tempfile.mkdtemp(prefix="corral-api-schema-"))
atexit.register(shutil.rmtree, _folder, True)
_db = store.Store.connect(f"sqlite:///{_folder / 'corral.db'}")
_client = client.Client(
    store=_db, executors={"noop": NoopExecutor()}, settings=config.Settings(), clock=FrozenClock()
)


async def _ready() -> str:
    await _db.database.migrate()
    _, secret = await _client.token_create(name="schema", tenant=None, role="admin")
    await _client.submit(spec={}, executor="noop")
    return secret


TOKEN = asyncio.run(_ready())
# The streams are left out: one that follows never ends (tests/integration/test_api.py
# reads them).
schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", create_app(_client)).exclude(
    path_regex="/stream$"
)


OPERATIONS = [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
@given(data=st.data())
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_its_schema_says(operation: Any, data: st.DataObject) -> None:
    case = data.draw(operation.as_strategy())
    case.call_and_validate(
        headers={"Authorization": f"Bearer {TOKEN}"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
