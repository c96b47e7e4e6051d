"""The `http` executor's settings, `[executors.http]`: which addresses requests may reach,
and how much of a request and a response corral keeps.

Light on purpose: every start-up reads it (through the executor's registration), and it
imports no HTTP client.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral import launching, netrules


class HttpExecutorSettings(BaseModel):
    """The `http` executor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_networks: tuple[str, ...] = Field(
        (),
        description="Addresses requests may reach although they are not public (loopback,"
        " private, link-local...), each ADDRESS[/PREFIX][:PORT[-PORT]] (IPv6 in brackets"
        ' with ports): e.g. ["127.0.0.1:8080"] for a local receiver. A network without'
        " ports opens 80 and 443 only. Empty: public addresses only (on any port).",
    )
    body_bytes: int = Field(
        launching.STREAM_BYTES,
        ge=0,
        le=16 * 1024 * 1024,
        description="How much of a response body the run log keeps (its first bytes).",
    )
    max_request_body_bytes: int = Field(
        256 * 1024,
        ge=0,
        le=16 * 1024 * 1024,
        description="The largest request body (`body`, or `json` as sent) an HTTP job may"
        " carry, refused at submit past it; its payload keeps max_payload_bytes.",
    )

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, networks: tuple[str, ...]) -> tuple[str, ...]:
        for net in networks:
            netrules.parse(net)
        return networks
