"""Who is asking, behind the proxies the operator trusts: `[api] trusted_proxies`.

A request's address is its peer's, the one machine that connected. Behind a reverse
proxy every request's peer is the proxy, and the asker's address is in the proxy's
X-Forwarded-For. That header is anyone's to write, so it is read only when the peer is a
proxy the settings list, and then from its right end: each trusted proxy appends the
address it saw, so the rightmost address that is not a trusted proxy is the asker (what
lies to its left came from the asker, and may be made up). With no proxy listed (the
default), X-Forwarded-For is never read.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ApiSettings(BaseModel):
    """The API's and the dashboard's own settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trusted_proxies: tuple[str, ...] = Field(
        (),
        description="The reverse proxies (addresses or networks, e.g. 10.0.0.5 or"
        " 10.0.0.0/24) whose X-Forwarded-For names the client: sign-in limits count the"
        " rightmost address in it that is not one of these. Default none: the header is"
        " never read.",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, given: tuple[str, ...]) -> tuple[str, ...]:
        for entry in given:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"{entry!r} is not an address or network (e.g. 10.0.0.5 or 10.0.0.0/24)"
                ) from None
        return given

    @property
    def networks(self) -> list[Network]:
        return [ipaddress.ip_network(e, strict=False) for e in self.trusted_proxies]


def client_address(peer: str, forwarded: Sequence[str], trusted: Sequence[Network]) -> str:
    """The asker's address: `peer`, unless the peer is a trusted proxy; then the rightmost
    address of the X-Forwarded-For headers (`forwarded`, in order) that is not one."""
    if not _within(peer, trusted):
        return peer
    hops = [hop.strip() for header in forwarded for hop in header.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _within(hop, trusted):
            return hop
    return hops[0] if hops else peer  # every hop a trusted proxy: the first one seen


def _within(address: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    return any(ip in network for network in trusted)
