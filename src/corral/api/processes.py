"""One listening socket served by several processes (`corral api --workers N`).

A Python process draws one page at a time: under many clients its answers queue behind
each other while the machine has cores to spare. The parent binds the socket, forks the
workers (before any event loop, thread or database connection exists in it), and from
then on only waits: each worker accepts on the shared socket with a client, a store
connection pool and a runner of bulk operations of its own, as separate `corral api`
processes would (any number may run on one database). A SIGTERM or SIGINT to the parent
is passed to every worker, which ends its requests in flight and exits. A worker that ends
while the others serve takes them all down, and the parent exits with its status: the
whole is restarted by whatever supervises it (systemd, Kubernetes), never patched up
inside, so a worker that cannot start never loops."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger("corral.api")

STOPPING = (signal.SIGTERM, signal.SIGINT)


def serve_forked(workers: int, serve: Callable[[int], int]) -> int:
    """Fork `workers` processes, each running `serve(index)` to its exit status, and wait
    for them all; the exit status: 0 when each ended 0 after a signal, else that of the
    first to fail (128 + N for a worker killed by signal N)."""
    if workers < 1:
        raise ValueError(f"workers: {workers} is not 1 or more")
    pids: dict[int, int] = {}
    stopping = False

    def stop_all(signum: int, _frame: object = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    # Set before the first fork, so a signal between two forks is never the default
    # (death of the parent, its workers left serving): each worker restores the default.
    previous = {sig: signal.signal(sig, stop_all) for sig in STOPPING}
    try:
        for index in range(workers):
            pid = os.fork()
            if pid == 0:
                os._exit(_worker(index, serve))
            pids[pid] = index
            if stopping:  # a signal came while forking: pass it to the one just made
                stop_all(signal.SIGTERM)
        return _wait(pids, stop_all, lambda: stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _worker(index: int, serve: Callable[[int], int]) -> int:
    for sig in STOPPING:
        signal.signal(sig, signal.SIG_DFL)
    try:
        return serve(index)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.exception("API worker %d (pid %d) failed", index, os.getpid())
        return 1


def _wait(
    pids: dict[int, int], stop_all: Callable[[int], None], stopping: Callable[[], bool]
) -> int:
    status = 0
    while pids:
        pid, waited = os.wait()  # retried after a signal's handler has run (PEP 475)
        index = pids.pop(pid)
        code = os.waitstatus_to_exitcode(waited)
        code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says
        if not stopping():
            log.error(
                "API worker %d (pid %d) ended with status %d while the others served:"
                " stopping them all, for the supervisor to start corral api again",
                index,
                pid,
                code,
            )
            stop_all(signal.SIGTERM)
            status = code or 1
        elif code and not status:
            status = code
    return status
