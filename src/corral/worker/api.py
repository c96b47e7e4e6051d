"""An attempt's calls to corral over its API, with its attempt token.

An attempt gets CORRAL_API_URL and CORRAL_ATTEMPT_TOKEN and no database URL: the URL is
`api_url` when corral has one, else, for a process job,
`unix:<state_dir>/attempt-api/attempts.sock`, the attempt API that the corral which
launched it answers on a Unix socket. The
heartbeat, the checkpoint functions and the Publisher go through here. The token is good
for this attempt only, and only while it is its job's current one: a refusal for that
reason is StaleFence, as from the store.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from corral import errors, launching

TIMEOUT = 30.0
"""Seconds one call may take, connecting included."""


@dataclass(frozen=True, slots=True)
class ApiReach:
    """Where this attempt reaches corral's API, and its token."""

    url: str
    token: str


def api_reach(env: Mapping[str, str] | None = None) -> ApiReach | None:
    """CORRAL_API_URL and CORRAL_ATTEMPT_TOKEN, when corral gave this attempt both."""
    env = os.environ if env is None else env
    url, token = env.get("CORRAL_API_URL"), env.get("CORRAL_ATTEMPT_TOKEN")
    return ApiReach(url.rstrip("/"), token) if url and token else None


UNIX = "unix:"
"""How CORRAL_API_URL names a Unix socket: `unix:/path/to/attempts.sock`."""

SUN_PATH_MAX = 107
"""The longest path a Unix socket may be bound or reached at (sockaddr_un's sun_path)."""


def socket_path(path: str) -> tuple[str, int | None]:
    """A path to bind or reach the Unix socket `path` at, and a descriptor to close once
    done (None: none). A path longer than sun_path holds is reached through its folder,
    held open: /proc/self/fd/N/NAME."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return path, None
    folder, name = os.path.split(path)
    fd = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{name}", fd


class AttemptApi:
    """One connection pool to the API for the calls of one attempt (`async with`)."""

    def __init__(self, reach: ApiReach, *, transport: httpx.AsyncBaseTransport | None = None):
        self.reach = reach
        base = reach.url
        self._folder: int | None = None
        if reach.url.startswith(UNIX) and transport is None:
            uds, self._folder = socket_path(reach.url.removeprefix(UNIX))
            transport = httpx.AsyncHTTPTransport(uds=uds)
            base = "http://corral"  # the socket is the address; the host is a name only
        self._http = httpx.AsyncClient(
            base_url=f"{base}/api/v1/attempt",
            headers={"Authorization": f"Bearer {reach.token}", "User-Agent": "corral-attempt"},
            timeout=TIMEOUT,
            trust_env=False,
            transport=transport,
        )

    async def __aenter__(self) -> AttemptApi:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._http.aclose()
        if self._folder is not None:
            os.close(self._folder)

    async def heartbeat(self) -> datetime | None:
        """Renew this attempt's lease; when it now ends (None: the job has none)."""
        said = (await self._call("POST", "/heartbeat")).json()["lease_until"]
        return None if said is None else datetime.fromisoformat(said)

    async def payload(self) -> Any:
        return (await self._call("GET", "/payload")).json()["payload"]

    async def checkpoint_load(self) -> tuple[int, Any] | None:
        said = (await self._call("GET", "/checkpoint")).json()
        return None if said["fence"] is None else (said["fence"], said["state"])

    async def checkpoint_save(self, state: Any) -> None:
        await self._call("PUT", "/checkpoint", json={"state": state})

    async def pointer_get(self, dataset: str) -> launching.Pointer | None:
        said = (await self._call("GET", "/pointer", params={"dataset": dataset})).json()
        return None if said is None else _pointer(said)

    async def pointer_swap(
        self, *, dataset: str, location: str, code_version: str | None
    ) -> launching.Pointer | int:
        """The pointer, swapped to `location`; or the newer fence that published already."""
        body = {"dataset": dataset, "location": location, "code_version": code_version}
        answer = await self._call("POST", "/pointer", json=body, refused_ok=True)
        if answer.status_code == 409 and isinstance(newer := answer.json().get("newer"), int):
            return newer
        _raise_for(answer, self.reach.url)
        return _pointer(answer.json())

    async def _call(
        self, method: str, path: str, *, refused_ok: bool = False, **kwargs: Any
    ) -> httpx.Response:
        try:
            answer = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise errors.StoreUnavailable(
                f"corral's API at {self.reach.url} did not answer: {exc!r}"
            ) from None
        if not refused_ok:
            _raise_for(answer, self.reach.url)
        return answer


def _raise_for(answer: httpx.Response, url: str) -> None:
    if answer.is_success:
        return
    try:
        said = str(answer.json().get("error", answer.text))
    except ValueError:
        said = answer.text[:200]
    status = answer.status_code
    if status == 409:
        raise errors.StaleFence(said.removeprefix("fence: "))
    if status == 404:
        raise errors.NotFound(said)
    if status == 422:
        raise errors.InvalidInput(said)
    if status in (401, 403):
        raise errors.ConfigError(f"corral's API at {url} refused CORRAL_ATTEMPT_TOKEN: {said}")
    raise errors.StoreUnavailable(f"corral's API at {url} answered {status}: {said}")


def _pointer(said: Mapping[str, Any]) -> launching.Pointer:
    return launching.Pointer(
        tenant=said["tenant"],
        dataset=said["dataset"],
        fence=said["fence"],
        location=said["location"],
        code_version=said["code_version"],
        published_at=datetime.fromisoformat(said["published_at"]),
    )
