"""A Kubernetes attempt's pod log in its run log: the end of what its main container wrote,
read when the executor sees its Job finished, capped like every run log; followed live by
`corral jobs logs --follow`; and the API double's `pods/{name}/log` as Kubernetes serves it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from corral import cli, config, launching, model, runtime
from corral.executors import argo, kube_objects, kubernetes
from tests.integration import test_kubernetes_end_to_end as end_to_end
from tests.support import kube_api
from tests.support.cluster import IMAGE, NS, executor_fixture, finished, launch, started
from tests.support.launches import sh
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(4 * PATIENCE)


ex = executor_fixture(kubernetes.KubernetesExecutor, request_timeout=2)


async def launched(ex: kubernetes.KubernetesExecutor, name: str, script: str) -> None:
    await ex.launch(launch(name, sh(script)))


def pod_log(obs: launching.Observation) -> launching.Stream:
    assert obs.output is not None
    stream = obs.output.stream(kube_objects.LOG_STREAM)
    assert stream is not None
    return stream


def pods_of(cluster: kube_api.Cluster, job: str) -> list[dict[str, Any]]:
    return [p for p in cluster.api.objects(kube_api.PODS) if p["metadata"]["name"].startswith(job)]


# --- the run log -----------------------------------------------------------------------------


async def test_a_finished_attempt_keeps_its_pod_log(ex: kubernetes.KubernetesExecutor) -> None:
    await launched(ex, "logs-1", "echo one; echo two >&2; echo three")
    obs = await finished(ex, "logs-1")
    assert obs.phase is launching.Phase.SUCCEEDED
    log = pod_log(obs)
    assert log.text == "one\ntwo\nthree\n", "stdout and stderr as the container wrote them"
    assert (log.size, log.cut) == (14, False)


async def test_a_long_log_keeps_its_end_cut_at_the_cap(ex: kubernetes.KubernetesExecutor) -> None:
    # About 390 KB, past one read's limitBytes: the end must still be what is kept.
    await launched(ex, "logs-2", "seq 1 60000; echo the end")
    log = pod_log(await finished(ex, "logs-2"))
    assert log.cut
    assert len(log.text.encode()) <= launching.STREAM_BYTES
    assert log.text.endswith("59999\n60000\nthe end\n")
    assert log.size >= len(log.text.encode())


async def test_a_failed_attempt_keeps_its_pod_log_first(ex: kubernetes.KubernetesExecutor) -> None:
    await launched(ex, "logs-3", "echo loading; echo 'no table: orders' >&2; exit 3")
    obs = await finished(ex, "logs-3")
    assert (obs.phase, obs.exit_code) == (launching.Phase.FAILED, 3)
    assert obs.output is not None
    assert [s.name for s in obs.output.streams] == [kube_objects.LOG_STREAM, "message"]
    assert pod_log(obs).text == "loading\nno table: orders\n", "the reason a person reads first"
    assert obs.output.streams[1].text == "no table: orders"


async def test_a_finished_workflow_keeps_its_pod_log_while_pod_gc_waits(
    cluster: kube_api.Cluster,
) -> None:
    # Fails on the code before: an Argo attempt's run log kept Argo's message alone.
    async with started(argo.ArgoExecutor, cluster, request_timeout=2) as wf:

        async def first_finish() -> launching.Observation:
            async for seen in wf.events():
                if seen.name == "wf-logs-1":
                    return seen
            raise AssertionError("the watch ended")

        watching = asyncio.create_task(first_finish())
        await cluster.api.watched()
        script = "echo reading; echo 'no table: orders' >&2; exit 3"
        await wf.launch(launch("wf-logs-1", sh(script), kind="argo"))
        seen = await asyncio.wait_for(watching, PATIENCE)
        assert pod_log(seen).text == "reading\nno table: orders\n", "the watch's finish has it"
        obs = await finished(wf, "wf-logs-1")
        assert (obs.phase, obs.exit_code) == (launching.Phase.FAILED, 3)
        assert pod_log(obs).text == "reading\nno table: orders\n"
        assert pods_of(cluster, "wf-logs-1"), "podGC keeps the pod for argo_pod_gc_delay"


async def test_a_workflow_whose_pod_gc_ran_first_says_so_in_place_of_its_log(
    cluster: kube_api.Cluster,
) -> None:
    async with started(argo.ArgoExecutor, cluster, request_timeout=2) as wf:
        await wf.launch(launch("wf-logs-2", sh("exit 4"), kind="argo"))

        async def pod_ended() -> bool:
            phases = [(p.get("status") or {}).get("phase") for p in pods_of(cluster, "wf-logs-2")]
            return phases == ["Failed"]

        await eventually(pod_ended, what="its pod ended")
        for pod in pods_of(cluster, "wf-logs-2"):  # podGC with no delay
            cluster.api.remove(kube_api.PODS, NS, pod["metadata"]["name"])
        obs = await finished(wf, "wf-logs-2")
        assert pod_log(obs).text == "(no pod log: its pod was gone before its log was read)"


def log_refused_once(cluster: kube_api.Cluster, code: int, reason: str, message: str) -> None:
    """The next read of a pod log is refused (a pod gone between its listing and its log)."""
    serve = cluster.api._serve_log

    def refused(request: Any) -> Any:
        cluster.api._serve_log = serve  # type: ignore[method-assign]
        raise kube_api.status_error(code, reason, message)

    cluster.api._serve_log = refused  # type: ignore[method-assign]


async def test_a_pod_gone_before_its_log_was_read_is_a_note(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await launched(ex, "logs-4", "echo done; exit 1")
    await finished(ex, "logs-4")
    (pod,) = pods_of(cluster, "logs-4")
    log_refused_once(cluster, 404, "NotFound", f'pods "{pod["metadata"]["name"]}" not found')
    obs = await finished(ex, "logs-4")
    assert obs.phase is launching.Phase.FAILED, "the outcome does not wait on the log"
    log = pod_log(obs)
    assert log.text == "(no pod log: its pod was gone before its log was read)"
    assert (log.size, log.cut) == (0, False)


async def test_a_job_whose_pod_is_gone_has_a_note(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await launched(ex, "logs-5", "exit 2")
    await finished(ex, "logs-5")
    for pod in pods_of(cluster, "logs-5"):
        name = pod["metadata"]["name"]
        cluster.api.patch(kube_api.PODS, NS, name, {"metadata": {"finalizers": None}})
        cluster.api.remove(kube_api.PODS, NS, name)
    obs = await finished(ex, "logs-5")
    assert pod_log(obs).text == "(no pod log: its pod was gone before its log was read)"


async def test_a_role_without_pods_log_gives_a_note(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await launched(ex, "logs-6", "echo hidden")
    await finished(ex, "logs-6")
    message = 'pods "x" is forbidden: cannot get resource "pods/log"'
    log_refused_once(cluster, 403, "Forbidden", message)
    obs = await finished(ex, "logs-6")
    assert obs.phase is launching.Phase.SUCCEEDED
    assert pod_log(obs).text.startswith("(no pod log: ")
    assert "pods/log" in pod_log(obs).text, "the refusal says what the Role lacks"


# --- the double's pods/log ---------------------------------------------------------------------


async def log_of(cluster: kube_api.Cluster, pod: str, **params: Any) -> tuple[int, str, bytes]:
    url = f"{cluster.url}/api/v1/namespaces/{NS}/pods/{pod}/log"
    query = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in params.items()}
    async with aiohttp.ClientSession() as http, http.get(url, params=query) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.read()


async def test_the_double_serves_a_pod_log_as_kubernetes_does(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    await launched(ex, "logs-7", "printf 'a\\nbb\\nccc\\n'")
    await finished(ex, "logs-7")
    (pod,) = pods_of(cluster, "logs-7")
    name = pod["metadata"]["name"]
    status, kind, body = await log_of(cluster, name)
    assert (status, kind, body) == (200, "text/plain", b"a\nbb\nccc\n")
    assert (await log_of(cluster, name, tailLines=2))[2] == b"bb\nccc\n"
    assert (await log_of(cluster, name, tailLines=2, limitBytes=4))[2] == b"bb\nc"
    assert (await log_of(cluster, name, follow=True))[2] == b"a\nbb\nccc\n", "ended: it ends"
    assert (await log_of(cluster, "nobody"))[0] == 404
    assert (await log_of(cluster, name, container="proxy"))[0] == 400


async def test_the_double_follows_a_running_pod_log(
    cluster: kube_api.Cluster, ex: kubernetes.KubernetesExecutor
) -> None:
    cluster.kubelet.hold = True
    await launched(ex, "logs-8", "echo first; sleep 1; echo second")
    (pod,) = await eventually(lambda: pods_of(cluster, "logs-8") or None, what="its pod")
    name = pod["metadata"]["name"]
    assert (await log_of(cluster, name))[0] == 400, "not started: waiting to start"
    cluster.kubelet.hold = False
    await eventually(lambda: (NS, name) in cluster.api.logs, what="its container started")
    url = f"{cluster.url}/api/v1/namespaces/{NS}/pods/{name}/log"
    lines: list[bytes] = []
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, params={"follow": "true"}) as response,
    ):
        async for line in response.content:
            lines.append(line)
            if len(lines) == 1:
                pod_now = cluster.api.find(kube_api.PODS, NS, name)
                assert pod_now is not None
                assert pod_now["status"]["phase"] == "Running", "the first line while it runs"
    assert lines == [b"first\n", b"second\n"]


# --- corral jobs logs --follow -----------------------------------------------------------------


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[end_to_end.Corral, Path]]:
    """corral's loops on the double, and a corral.toml the CLI reads the same store with."""
    async with kube_api.cluster() as c:
        settings = end_to_end.make_settings(tmp_path, c.url)
        await end_to_end.migrated(settings)
        toml = tmp_path / "corral.toml"
        toml.write_text(
            f'database_url = "{settings.database_url}"\n'
            f'state_dir = "{tmp_path / "state"}"\n'
            "[executors]\n"
            'enabled = ["kubernetes"]\n'
            "[executors.kubernetes]\n"
            'namespace = "default"\n'
            f'kubeconfig = "{tmp_path / "kubeconfig"}"\n',
            encoding="utf-8",
        )
        stop = asyncio.Event()
        loops = asyncio.create_task(runtime.serve(settings, stop))
        async with runtime.connect(settings) as cl:
            try:
                yield end_to_end.Corral(cl, c), toml
            finally:
                stop.set()
                await asyncio.wait_for(loops, PATIENCE)


async def test_jobs_logs_follow_prints_a_running_pods_lines_as_they_come(
    served: tuple[end_to_end.Corral, Path],
) -> None:
    corral, toml = served
    gate = toml.parent / "gate"  # the pod runs on until the test has seen its first line
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second"
    job_id, _ = await corral.client.submit(
        executor="kubernetes", spec={"image": IMAGE, "command": sh(script)}
    )
    await corral.wait(job_id, model.JobState.RUNNING)
    command = ["-m", "corral", "--config", str(toml), "jobs", "logs", str(job_id), "--follow"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    printed: list[str] = []
    while "first" not in printed:
        line = await asyncio.wait_for(proc.stdout.readline(), PATIENCE)
        assert line, "it ended before the first line came"
        printed.append(line.decode().rstrip("\n"))
    view = await corral.client.job(job_id)
    assert view.job.state is model.JobState.RUNNING, "printed while the pod runs"
    gate.touch()
    rest, errors = await asyncio.wait_for(proc.communicate(), PATIENCE)
    assert proc.returncode == 0, errors.decode()
    printed += rest.decode().splitlines()
    assert "--- log ---" in printed
    assert [line for line in printed if line in ("first", "second")] == ["first", "second"]
    assert (await corral.client.job(job_id)).job.state is model.JobState.SUCCEEDED


def test_jobs_logs_follow_without_a_cluster_here_reads_run_logs(tmp_path: Path) -> None:
    toml = tmp_path / "corral.toml"
    toml.write_text(
        f'database_url = "sqlite:///{tmp_path}/corral.db"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
        "[executors]\n"
        'enabled = ["process", "kubernetes"]\n'
        "[executors.kubernetes]\n"
        f'kubeconfig = "{tmp_path / "missing"}"\n',
        encoding="utf-8",
    )

    async def a_cancelled_job() -> int:
        settings = config.Settings.load(toml)
        await end_to_end.migrated(settings)
        async with runtime.connect(settings, platforms=False) as c:
            job_id, _ = await c.submit(spec={"command": ["true"]})
            await c.cancel(job_id)
            return job_id

    job_id = asyncio.run(a_cancelled_job())
    command = ["--config", str(toml), "jobs", "logs", str(job_id), "--follow"]
    result = CliRunner().invoke(cli.main, command)
    assert result.exit_code == 0, result.output
    assert "cannot load the cluster's connection settings" in result.output
    assert "a running pod's log shows once its attempt ends" in result.output
