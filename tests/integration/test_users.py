"""Dashboard users and sessions on both databases: passwords kept as argon2 hashes,
sign-in with a password or an API token, sessions that end with their user, their token
or their time, and the `corral users` command."""

from __future__ import annotations

import pytest

from corral import access, client, config, errors, store
from corral.testing import FrozenClock
from tests.support.noop import NoopExecutor


@pytest.fixture
def c(db: store.Store, clock: FrozenClock) -> client.Client:
    return client.Client(
        store=db, executors={"noop": NoopExecutor()}, settings=config.Settings(), clock=clock
    )


async def test_a_user_signs_in_with_their_password_only(c: client.Client) -> None:
    made = await c.user_add("ada", password="correct horse", tenant="a", role="operator")
    assert (made.name, made.tenant, made.role) == ("ada", "a", access.Role.OPERATOR)
    assert await c.sign_in("ada", "wrong horse") is None
    assert await c.sign_in("nobody", "correct horse") is None
    signed = await c.sign_in("ada", "correct horse")
    assert signed is not None
    secret, session = signed
    assert (session.name, session.tenant, session.role) == ("ada", "a", access.Role.OPERATOR)
    again = await c.session(secret)
    assert again is not None
    assert again.csrf == session.csrf
    assert await c.session(secret + "x") is None
    found = await c.store.users.password(name="ada")
    assert found is not None
    assert found[1].startswith("$argon2id$")


async def test_a_session_ends_with_sign_out_removal_or_time(
    c: client.Client, clock: FrozenClock
) -> None:
    await c.user_add("ada", password="correct horse", tenant=None, role="viewer")
    signed = [await c.sign_in("ada", "correct horse") for _ in range(3)]
    first, second, third = (s[0] for s in signed if s is not None)
    await c.sign_out(first)
    assert await c.session(first) is None
    clock.advance(client.users.SESSION_LIFETIME.total_seconds() + 1)
    assert await c.session(second) is None
    clock.advance(-client.users.SESSION_LIFETIME.total_seconds() - 1)
    assert await c.session(third) is not None
    await c.user_remove("ada")
    assert await c.session(third) is None
    assert await c.sign_in("ada", "correct horse") is None
    assert await c.users() == []


async def test_a_token_session_ends_when_its_token_is_revoked(c: client.Client) -> None:
    token, secret = await c.token_create(name="ops", tenant="b", role="admin")
    assert await c.sign_in_token("corral_not-a-token") is None
    signed = await c.sign_in_token(secret)
    assert signed is not None
    cookie, session = signed
    assert (session.tenant, session.role, session.token_id) == ("b", access.Role.ADMIN, token.id)
    await c.token_revoke(token.id)
    assert await c.session(cookie) is None


async def test_names_are_unique_until_removed_and_input_is_checked(c: client.Client) -> None:
    await c.user_add("ada", password="correct horse", tenant="a", role="viewer")
    with pytest.raises(errors.Conflict, match="exists already"):
        await c.user_add("ada", password="another one", tenant="a", role="viewer")
    await c.user_remove("ada")
    with pytest.raises(errors.NotFound):
        await c.user_remove("ada")
    again = await c.user_add("ada", password="another one", tenant=None, role="admin")
    assert (again.tenant, again.role) == (None, access.Role.ADMIN)
    assert await c.sign_in("ada", "correct horse") is None
    assert await c.sign_in("ada", "another one") is not None
    for bad, field in (
        ({"name": "no spaces"}, "name"),
        ({"role": "owner"}, "role"),
        ({"tenant": "a b"}, "tenant"),
        ({"password": "short"}, "password"),
    ):
        args = {"name": "bob", "password": "long enough", "tenant": "a", "role": "viewer", **bad}
        name = args.pop("name")
        with pytest.raises(errors.InvalidInput, match=f"^{field}:"):
            await c.user_add(name, **args)
