"""A silent network partition between one corral process and PostgreSQL, for chaos tests.

A network namespace joined to this host by a veth pair on private addresses, and a
PostgreSQL cluster of the test's own, listening on the host's end of the pair and on
127.0.0.1. A process run inside the namespace reaches the cluster only over the pair; `cut`
adds nftables rules inside the namespace that drop every packet in and out (dropped, never
refused: the other end hears nothing at all), `heal` removes them. Everything needs root;
`unavailable()` says why it cannot run here, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.net import free_port

NFT = Path("/usr/sbin/nft")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_USER = "postgres"
_TABLE = "corral_partition"


def unavailable() -> str | None:
    """Why partitions cannot be made on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "needs root: network namespaces, nftables and a PostgreSQL cluster of its own"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` for network namespaces"
    if not NFT.exists():
        return f"needs nftables ({NFT}); `make` installs it when run as root"
    for tool in ("initdb", "pg_ctl"):
        if not (PG_BIN / tool).exists():
            return f"needs PostgreSQL 15's server binaries ({PG_BIN / tool} is missing)"
    if shutil.which("runuser") is None:
        return "needs runuser, to run PostgreSQL as its own user"
    try:
        import pwd

        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"needs the {PG_USER!r} user that PostgreSQL runs as"
    return None


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=check)


@dataclass
class Namespace:
    """A network namespace with one veth pair on a /30 of 10.231.0.0/16."""

    name: str
    host_if: str
    inner_if: str
    host_ip: str
    inner_ip: str

    @classmethod
    @contextlib.contextmanager
    def created(cls) -> Iterator[Namespace]:
        """A fresh namespace, unique to this run; removed on exit, also on failure. Raises
        OSError (with why) when namespaces cannot be made here."""
        tag = f"{os.getpid() % 10_000}{random.randrange(1_000):03d}"
        base = random.randrange(16_384) * 4  # the /30's first address within 10.231.0.0/16
        prefix = f"10.231.{base >> 8}"
        ns = cls(
            name=f"corral-part-{tag}",
            host_if=f"crh{tag}",
            inner_if=f"crn{tag}",
            host_ip=f"{prefix}.{(base & 255) + 1}",
            inner_ip=f"{prefix}.{(base & 255) + 2}",
        )
        made = _run("ip", "netns", "add", ns.name, check=False)
        if made.returncode != 0:
            raise OSError(f"`ip netns add` failed: {made.stderr.strip()}")
        try:
            ns._wire()
            yield ns
        finally:
            ns._remove()

    def _wire(self) -> None:
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.inner_if)
        _run("ip", "link", "set", self.inner_if, "netns", self.name)
        _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        for args in (
            ("ip", "addr", "add", f"{self.inner_ip}/30", "dev", self.inner_if),
            ("ip", "link", "set", self.inner_if, "up"),
            ("ip", "link", "set", "lo", "up"),
        ):
            _run(*self.inside(args))

    def _remove(self) -> None:
        # Deleting the namespace deletes its end of the pair (and so the pair) and its rules.
        _run("ip", "netns", "del", self.name, check=False)
        _run("ip", "link", "del", self.host_if, check=False)

    def inside(self, command: Sequence[str]) -> list[str]:
        """`command` to run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *command]

    def cut(self) -> None:
        """Drop every packet in and out of the namespace's end: silence, not refusal."""
        rules = (
            f"table inet {_TABLE} {{\n"
            f"  chain input {{ type filter hook input priority -10; policy accept;"
            f' iifname "{self.inner_if}" drop; }}\n'
            f"  chain output {{ type filter hook output priority -10; policy accept;"
            f' oifname "{self.inner_if}" drop; }}\n'
            "}\n"
        )
        subprocess.run(
            self.inside([str(NFT), "-f", "-"]),
            input=rules,
            text=True,
            capture_output=True,
            timeout=60,
            check=True,
        )

    def heal(self) -> None:
        _run(*self.inside([str(NFT), "delete", "table", "inet", _TABLE]))


@dataclass
class Cluster:
    """A PostgreSQL 15 cluster of the test's own, run as the postgres user, trusting every
    local connection and the namespace's address."""

    root: Path
    port: int
    listen: tuple[str, ...]

    @classmethod
    @contextlib.contextmanager
    def started(cls, *, listen: Sequence[str], trust: str) -> Iterator[Cluster]:
        """A started cluster listening on `listen` (and 127.0.0.1), trusting `trust` (a
        CIDR); stopped and removed on exit, also on failure."""
        root = Path(tempfile.mkdtemp(prefix="corral-pg-"))
        cluster = cls(root=root, port=free_port(), listen=("127.0.0.1", *listen))
        try:
            shutil.chown(root, PG_USER, PG_USER)
            cluster._init(trust)
            cluster._pg_ctl("start", "-w", "-t", "60", "-l", str(root / "server.log"))
            yield cluster
        finally:
            if (root / "data" / "postmaster.pid").exists():
                cluster._pg_ctl("stop", "-m", "immediate", "-w", check=False)
            shutil.rmtree(root, ignore_errors=True)

    def _as_postgres(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("runuser", "-u", PG_USER, "--", *args, check=check)

    def _init(self, trust: str) -> None:
        data = self.root / "data"
        self._as_postgres(
            str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", PG_USER, "--no-sync"
        )
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {trust} trust\n")
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(
                f"listen_addresses = '{','.join(self.listen)}'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\nfsync = off\n"
                "synchronous_commit = off\nfull_page_writes = off\nmax_connections = 100\n"
            )

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.root / "data"), *args, check=check)

    def url(self, host: str = "127.0.0.1", **query: str) -> str:
        tail = "&".join(f"{k}={v}" for k, v in query.items())
        return f"postgresql+psycopg://{PG_USER}@{host}:{self.port}/postgres" + (
            f"?{tail}" if tail else ""
        )

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""
