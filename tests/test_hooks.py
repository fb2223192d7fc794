"""Completion hooks through ``HookRunner`` with real processes, a real HTTP server on 127.0.0.1 and
a real ledger: what a command receives, the process group killed at its timeout, retries until a
2xx, the ``on`` filter, giving up, and results held by a process that ended, settled by the next
one."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from ocrwatch import config
from ocrwatch.config import HookConfig, InboxConfig, OutputConfig
from ocrwatch.errors import ConfigError
from ocrwatch.infra.metrics import Metrics
from ocrwatch.jobs.admission import job_id
from ocrwatch.jobs.archive import Archiver
from ocrwatch.jobs.hooks import HookRunner, _header, sidecar_locations
from ocrwatch.sinks.base import dump_json
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sinks.s3 import S3Sink
from ocrwatch.sources.base import Job, LocalFile, S3Object
from ocrwatch.sources.local import LocalSource
from ocrwatch.store.asyncledger import AsyncLedger
from ocrwatch.store.ledger import Fingerprint, Ledger

REPO = Path(__file__).resolve().parent.parent

RECORDER = """
import json, os, sys, time
out = sys.argv[1]
record = {
    "argv": sys.argv[2:],
    "stdin": sys.stdin.buffer.read().decode(),
    "env": {k: v for k, v in os.environ.items() if k.startswith("OCRWATCH_")},
    "environ": dict(os.environ),
}
os.makedirs(out, exist_ok=True)
name = os.path.join(out, f"{time.time_ns()}-{os.getpid()}.json")
with open(name + ".tmp", "w") as f:
    json.dump(record, f)
os.rename(name + ".tmp", name)
"""

SLEEPER = """
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
time.sleep(300)
"""

BACKGROUND = """
import subprocess, sys
child = subprocess.Popen(["sleep", "300"])  # holds stdout and stderr; left running
open(sys.argv[1], "w").write(str(child.pid))
"""

FAILER = """
import sys
sys.stdin.read()
print("the ticket system said no", flush=True)
sys.exit(3)
"""


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def records(folder: Path) -> list[dict[str, Any]]:
    return (
        [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
        if folder.is_dir()
        else []
    )


async def eventually(
    predicate: Callable[[], Any], timeout: float = 30.0, what: str = "the condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def logged(logs: list[dict[str, Any]], event: str) -> bool:
    """Whether ``event`` was logged: a delivery logs its end after its ledger row and its metric,
    so a test that waits for the line reads both as they end, not between the two."""
    return any(entry["event"] == event for entry in logs)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper that a container may not have."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def rows(ledger: Ledger) -> list[dict[str, Any]]:
    with sqlite3.connect(ledger.path) as conn:
        conn.row_factory = sqlite3.Row
        return [
            dict(r)
            for r in conn.execute(
                "SELECT e.key, e.status, e.json, e.md, e.held_by, d.hook, d.state, d.attempts, "
                "d.last_error FROM hook_deliveries d JOIN hook_events e ON e.id = d.event ORDER BY "
                "e.id, d.hook"
            )
        ]


def hook(**fields: Any) -> HookConfig:
    return HookConfig.model_validate(
        {"backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.2, **fields}
    )


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    with Ledger(tmp_path / "state" / "ledger.sqlite3") as opened:
        yield opened


@pytest.fixture
def job(tmp_path: Path, ledger: Ledger) -> Job:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "report.pdf").write_bytes(b"%PDF-1.4 not really")
    made = Job(origin=LocalFile(path=inbox / "report.pdf", inbox=inbox), source="local")
    ledger.admit(made, Fingerprint(size=19, mtime_ns=1, sha256="ab" * 32))
    return made


def result(job: Job, status: str = "ok") -> dict[str, Any]:
    return {
        "schema": "ocrwatch/1",
        "status": status,
        "source": {"uri": job.origin.uri},
        "pages": [{"page": 1}],
    }


@pytest.fixture
async def runners() -> AsyncIterator[list[HookRunner]]:
    made: list[HookRunner] = []
    yield made
    for runner in made:
        await runner.stop()


async def started(
    runners: list[HookRunner], hooks: list[HookConfig], ledger: Ledger, metrics: Metrics
) -> HookRunner:
    runner = HookRunner(hooks, AsyncLedger(ledger), metrics)
    runners.append(runner)
    await runner.start()
    return runner


async def finish(runner: HookRunner, ledger: Ledger, job: Job, document: dict[str, Any]) -> None:
    """What the pipeline does: hold, publish (here: nothing to write), record the end, release."""
    event = await runner.hold(job, document, LocalSink())
    if document["status"] == "failed":
        ledger.mark_failed(job.key, {"kind": "corrupt_pdf"})
    else:
        ledger.mark_done(job.key)
    await runner.release(event)


async def test_a_command_gets_the_result_on_stdin_the_five_variables_and_its_argv_untouched(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    out = tmp_path / "received"
    hostile = [
        f"$(touch {tmp_path}/by-subshell)",
        f"; touch {tmp_path}/by-semicolon",
        "*",
        "a b\tc",
        "'\"`|&<>",
        "",
    ]
    command = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out), *hostile]
    runner = await started(runners, [hook(command=command)], ledger, Metrics())
    document = result(job)
    await finish(runner, ledger, job, document)

    (received,) = await eventually(lambda: records(out), what="the hook's record")
    assert received["stdin"].encode() == dump_json(document)  # the very bytes of the JSON sidecar
    assert received["argv"] == hostile
    assert not (tmp_path / "by-subshell").exists() and not (tmp_path / "by-semicolon").exists()
    assert received["env"] == {
        "OCRWATCH_STATUS": "ok",
        "OCRWATCH_SOURCE": job.origin.uri,
        "OCRWATCH_ORIGINAL": job.origin.uri,  # kept where it was dropped: the same place
        "OCRWATCH_JSON": str(tmp_path / "inbox" / "report.pdf.json"),
        "OCRWATCH_MD": str(tmp_path / "inbox" / "report.pdf.md"),
    }
    await eventually(
        lambda: rows(ledger) and rows(ledger)[0]["state"] == "done", what="the delivery done"
    )
    assert rows(ledger)[0]["attempts"] == 1


DAEMON_SECRETS = {
    "OCRWATCH_S3_0_SECRET_ACCESS_KEY": "s3-secret-by-environment",
    "OCRWATCH_S3_0_TOKEN": "webhook-token-by-environment",
    "OCRWATCH_HOOK_0_TOKEN": "hook-token-by-environment",
    "OCRWATCH_LOG_LEVEL": "debug",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "CREDENTIALS_DIRECTORY": "/run/credentials/ocrwatch.service",
    "NOTIFY_SOCKET": "/run/systemd/notify",
    "DATABASE_PASSWORD": "an-unrelated-secret",
}
"""What a daemon's environment may carry that is no hook's: its configuration and secrets, cloud
credentials, systemd's hand-over, anything else of the host's."""


def minimal_environment(tmp_path: Path) -> dict[str, str]:
    """What a hook takes from the daemon's environment (``LC_CTYPE`` set, so that no Python
    coerces a C locale by adding it)."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "LC_CTYPE": "C.UTF-8",
        "LC_TIME": "C.UTF-8",
        "TZ": "Europe/Berlin",
        "TMPDIR": str(tmp_path),
    }


async def test_a_command_gets_its_variables_and_a_minimal_environment_never_the_daemons_secrets(
    tmp_path: Path,
    ledger: Ledger,
    job: Job,
    runners: list[HookRunner],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept = minimal_environment(tmp_path)
    for name, value in {**DAEMON_SECRETS, **kept}.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "received"
    command = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out)]
    runner = await started(runners, [hook(command=command)], ledger, Metrics())
    await finish(runner, ledger, job, result(job))

    (received,) = await eventually(lambda: records(out), what="the hook's record")
    assert received["environ"] == {
        **kept,
        "OCRWATCH_STATUS": "ok",
        "OCRWATCH_SOURCE": job.origin.uri,
        "OCRWATCH_ORIGINAL": job.origin.uri,
        "OCRWATCH_JSON": str(tmp_path / "inbox" / "report.pdf.json"),
        "OCRWATCH_MD": str(tmp_path / "inbox" / "report.pdf.md"),
    }


async def test_a_hook_still_running_at_its_timeout_is_killed_with_its_process_group(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    pids = tmp_path / "pids"
    command = [sys.executable, script(tmp_path, "sleeper.py", SLEEPER), str(pids)]
    metrics = Metrics()
    runner = await started(
        runners,
        [hook(name="slow", command=command, timeout_seconds=1, max_attempts=1)],
        ledger,
        metrics,
    )
    with capture_logs() as logs:
        began = time.monotonic()
        await finish(runner, ledger, job, result(job))
        await eventually(lambda: logged(logs, "hook_failed"), what="the delivery given up")
    assert rows(ledger)[0]["state"] == "failed"
    assert time.monotonic() - began < 60  # not the 300 s the hook would sleep
    hook_pid, child_pid = map(int, pids.read_text().split())
    await eventually(
        lambda: not alive(hook_pid) and not alive(child_pid), 10, "the hook and its child killed"
    )
    (failed,) = [entry for entry in logs if entry["event"] == "hook_failed"]
    assert "still running after 1s" in failed["error"] and failed["hook"] == "slow"
    failures = metrics.registry.get_sample_value(
        "ocrwatch_hook_deliveries_total", {"hook": "slow", "outcome": "failed"}
    )
    assert failures == 1


async def test_a_hook_that_leaves_a_child_is_delivered_when_it_exits_and_its_child_is_killed(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    pid = tmp_path / "child"
    command = [sys.executable, script(tmp_path, "background.py", BACKGROUND), str(pid)]
    runner = await started(runners, [hook(command=command, timeout_seconds=120)], ledger, Metrics())
    try:
        await finish(runner, ledger, job, result(job))
        await eventually(
            lambda: rows(ledger)[0]["state"] == "done", 60, "the delivery done, not the child's end"
        )
        assert rows(ledger)[0]["attempts"] == 1
        await eventually(lambda: not alive(int(pid.read_text())), 10, "the child killed")
    finally:
        if pid.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid.read_text()), signal.SIGKILL)


async def test_a_webhook_answered_500_twice_then_200_is_delivered_once_in_three_attempts(
    ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    seen: list[tuple[dict[str, str], bytes]] = []

    async def receive(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.read()))
        return web.Response(
            status=500 if len(seen) <= 2 else 200, text="busy" if len(seen) <= 2 else "thanks"
        )

    app = web.Application()
    app.router.add_post("/ocr-done", receive)
    server = web.AppRunner(app)
    await server.setup()
    site = web.TCPSite(server, "127.0.0.1", 0)
    await site.start()
    port = server.addresses[0][1]
    try:
        metrics = Metrics()
        url = f"http://127.0.0.1:{port}/ocr-done"
        runner = await started(
            runners, [hook(name="chat", url=url, token="s3cret")], ledger, metrics
        )
        document = result(job, "partial")
        with capture_logs() as logs:
            await finish(runner, ledger, job, document)
            await eventually(lambda: logged(logs, "hook_delivered"), what="the delivery done")
        assert len(seen) == 3
        for headers, body in seen:
            assert headers["Authorization"] == "Bearer s3cret"
            assert headers["Content-Type"] == "application/json"
            assert headers["Ocrwatch-Status"] == "partial"
            assert headers["Ocrwatch-Source"] == headers["Ocrwatch-Original"] == job.origin.uri
            assert body == dump_json(document)
        (row,) = rows(ledger)
        assert (row["state"], row["attempts"], row["hook"]) == ("done", 3, "chat")
        sample = metrics.registry.get_sample_value
        assert sample("ocrwatch_hook_attempts_total", {"hook": "chat", "result": "error"}) == 2
        assert sample("ocrwatch_hook_attempts_total", {"hook": "chat", "result": "ok"}) == 1
        assert (
            sample("ocrwatch_hook_deliveries_total", {"hook": "chat", "outcome": "delivered"}) == 1
        )
        assert sample("ocrwatch_hook_deliveries_total", {"hook": "chat", "outcome": "failed"}) == 0
        assert sample("ocrwatch_hook_pending", {"hook": "chat"}) == 0
        retries = [entry for entry in logs if entry["event"] == "hook_retry"]
        assert len(retries) == 2 and "answered 500: busy" in retries[0]["error"]
        (delivered,) = [entry for entry in logs if entry["event"] == "hook_delivered"]
        assert delivered["attempts"] == 3 and delivered["job_id"] == job_id(job)
        assert delivered["uri"] == job.origin.uri
    finally:
        await server.cleanup()


async def test_a_hook_runs_only_for_the_statuses_it_is_on_for(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    out = tmp_path / "received"
    command = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out)]
    runner = await started(runners, [hook(command=command, on=["failed"])], ledger, Metrics())
    assert await runner.hold(job, result(job, "ok"), LocalSink()) is None
    assert await runner.hold(job, result(job, "partial"), LocalSink()) is None
    assert rows(ledger) == []

    failure = {"schema": "ocrwatch/1", "status": "failed", "error": {"kind": "corrupt_pdf"}}
    await finish(runner, ledger, job, failure)
    (received,) = await eventually(lambda: records(out), what="the hook's record")
    assert received["env"]["OCRWATCH_STATUS"] == "failed"
    assert received["env"]["OCRWATCH_JSON"] == str(tmp_path / "inbox" / "report.pdf.error.json")
    assert received["env"]["OCRWATCH_MD"] == ""
    assert json.loads(received["stdin"]) == failure


async def test_a_hook_that_keeps_failing_is_given_up_after_max_attempts_with_its_output(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    metrics = Metrics()
    command = [sys.executable, script(tmp_path, "fail.py", FAILER)]
    runner = await started(
        runners, [hook(name="ticket", command=command, max_attempts=2)], ledger, metrics
    )
    with capture_logs() as logs:
        await finish(runner, ledger, job, result(job))
        await eventually(lambda: logged(logs, "hook_failed"), what="the delivery given up")
    (row,) = rows(ledger)
    assert (
        row["state"] == "failed"
        and row["attempts"] == 2
        and "exit status 3: the ticket system said no" in row["last_error"]
    )
    (failed,) = [entry for entry in logs if entry["event"] == "hook_failed"]
    assert (
        failed["attempts"] == 2
        and failed["kind"] == "hook_failed"
        and failed["uri"] == job.origin.uri
    )
    assert (
        metrics.registry.get_sample_value(
            "ocrwatch_hook_attempts_total", {"hook": "ticket", "result": "error"}
        )
        == 2
    )
    assert ledger.known(job.key).state == "done"  # the document is not the hook's to fail


async def test_results_held_by_a_process_that_ended_are_released_if_published_and_dropped_if_not(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    out = tmp_path / "received"
    command = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out)]
    other = Job(
        origin=LocalFile(path=job.origin.path.with_name("other.pdf"), inbox=job.origin.inbox),
        source="local",
    )
    ledger.admit(other, Fingerprint(size=3, mtime_ns=1, sha256="cd" * 32))

    # holds, and "dies" before releasing
    ended = HookRunner([hook(command=command)], AsyncLedger(ledger), Metrics())
    await ended.hold(job, result(job), LocalSink())
    await ended.hold(other, result(other), LocalSink())
    await ended.stop()
    # what the next start's resume does for a job whose sidecars were written
    ledger.mark_done(job.key)
    assert [row["held_by"] is not None for row in rows(ledger)] == [True, True]

    with capture_logs() as logs:
        await started(runners, [hook(command=command)], ledger, Metrics())
    (received,) = await eventually(lambda: records(out), what="the published result's hook")
    assert received["env"]["OCRWATCH_SOURCE"] == job.origin.uri
    published = [(job.key, "done")]  # and the unpublished one forgotten
    await eventually(
        lambda: [(row["key"], row["state"]) for row in rows(ledger)] == published, what="settled"
    )
    assert [entry["recovered"] for entry in logs if entry["event"] == "hooks_ready"] == [1]


async def test_a_stop_kills_a_running_hook_gives_its_attempt_back_and_the_next_start_runs_it_again(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    pids, out = tmp_path / "pids", tmp_path / "received"
    slow = [sys.executable, script(tmp_path, "sleeper.py", SLEEPER), str(pids)]
    first = HookRunner([hook(name="post", command=slow)], AsyncLedger(ledger), Metrics())
    await first.start()
    await finish(first, ledger, job, result(job))
    await eventually(pids.exists, what="the hook running")
    hook_pid, child_pid = map(int, pids.read_text().split())
    await first.stop()
    await eventually(
        lambda: not alive(hook_pid) and not alive(child_pid), 10, "the hook's group killed"
    )
    assert [(row["state"], row["attempts"]) for row in rows(ledger)] == [("pending", 0)]

    record = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out)]
    metrics = Metrics()
    await started(runners, [hook(name="post", command=record)], ledger, metrics)
    await eventually(
        lambda: rows(ledger)[0]["state"] == "done", what="the delivery done after the restart"
    )
    assert len(records(out)) == 1 and rows(ledger)[0]["attempts"] == 1
    # The worker lets the delivery go just after recording it done.
    pending = functools.partial(
        metrics.registry.get_sample_value, "ocrwatch_hook_pending", {"hook": "post"}
    )
    await eventually(lambda: pending() == 0, 5, "nothing pending")


PAUSED_RECORDER = """
import json, os, sys, time
payload = sys.stdin.read()
time.sleep(1.0)
os.makedirs(sys.argv[1], exist_ok=True)
open(os.path.join(sys.argv[1], "record.json"), "w").write(json.dumps({"stdin": payload}))
"""


async def test_a_stop_lets_a_running_hook_finish_within_its_grace_and_records_it_done(
    tmp_path: Path, ledger: Ledger, job: Job
) -> None:
    out = tmp_path / "received"
    command = [sys.executable, script(tmp_path, "paused.py", PAUSED_RECORDER), str(out)]
    runner = HookRunner([hook(name="post", command=command)], AsyncLedger(ledger), Metrics())
    await runner.start()
    await finish(runner, ledger, job, result(job))
    await eventually(lambda: rows(ledger)[0]["attempts"] == 1, what="the hook running")
    await runner.stop(grace=30)
    assert len(records(out)) == 1
    assert [(row["state"], row["attempts"]) for row in rows(ledger)] == [("done", 1)]


def archived(tmp_path: Path, job: Job) -> tuple[Archiver, Path]:
    """An archiver moving ``job``'s inbox into ``archive/``, the job's sidecars written beside it;
    the folder its sidecars go to."""
    assert isinstance(job.origin, LocalFile)
    folder = job.origin.path.parent
    (folder / "report.pdf.md").write_text("<!-- page 1 -->\n\nText\n")
    data = job.origin.path.read_bytes()  # what the run read, as its sidecar records it
    read = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    document = result(job) | {"source": result(job)["source"] | read}
    (folder / "report.pdf.json").write_bytes(dump_json(document))
    (tmp_path / "archive").mkdir()  # as the daemon's start makes it (roots.prepare)
    inbox = LocalSource(
        [InboxConfig(path=job.origin.inbox, on_success="move")],
        reconcile_seconds=60,
        name_template="{name}",
    )
    archive = OutputConfig(archive_dir=tmp_path / "archive")
    return Archiver(
        archive, {"local": inbox}, {"local": LocalSink()}, Metrics()
    ), tmp_path / "archive" / "inbox"


def settle(archiver: Archiver, job: Job) -> dict[str, str] | None:
    assert isinstance(job.origin, LocalFile)
    return archiver.apply_on_success(
        job, "ok", hashlib.sha256(job.origin.path.read_bytes()).hexdigest()
    )


async def test_a_hook_after_a_move_is_given_the_sidecars_where_the_move_put_them(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    out = tmp_path / "received"
    runner = await started(
        runners,
        [hook(command=[sys.executable, script(tmp_path, "r.py", RECORDER), str(out)])],
        ledger,
        Metrics(),
    )
    archiver, moved_to = archived(tmp_path, job)
    event = await runner.hold(job, result(job), LocalSink())  # what the pipeline does, in its order
    ledger.mark_done(job.key)
    await runner.release(event, settle(archiver, job))

    (received,) = await eventually(lambda: records(out), what="the hook's record")
    assert received["env"]["OCRWATCH_JSON"] == str(moved_to / "report.pdf.json")
    assert received["env"]["OCRWATCH_MD"] == str(moved_to / "report.pdf.md")
    assert (
        Path(received["env"]["OCRWATCH_JSON"]).is_file()
        and Path(received["env"]["OCRWATCH_MD"]).is_file()
    )
    assert received["env"]["OCRWATCH_SOURCE"] == (moved_to / "report.pdf").as_uri()
    assert received["env"]["OCRWATCH_ORIGINAL"] == job.origin.uri
    recorded = rows(ledger)[0]  # the paths' bytes (a name need not be UTF-8)
    paths = (os.fsdecode(recorded["json"]), os.fsdecode(recorded["md"]))
    assert paths == (received["env"]["OCRWATCH_JSON"], received["env"]["OCRWATCH_MD"])


async def test_a_webhook_after_a_move_is_told_both_places_in_its_headers(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    seen: list[dict[str, str]] = []

    async def receive(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(text="thanks")

    app = web.Application()
    app.router.add_post("/done", receive)
    server = web.AppRunner(app)
    await server.setup()
    await web.TCPSite(server, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{server.addresses[0][1]}/done"
        runner = await started(runners, [hook(name="web", url=url)], ledger, Metrics())
        archiver, moved_to = archived(tmp_path, job)
        event = await runner.hold(job, result(job), LocalSink())
        ledger.mark_done(job.key)
        await runner.release(event, settle(archiver, job))
        (headers,) = await eventually(lambda: seen, what="the POST")
        assert headers["Ocrwatch-Status"] == "ok"
        assert headers["Ocrwatch-Source"] == (moved_to / "report.pdf").as_uri()
        assert headers["Ocrwatch-Original"] == job.origin.uri
    finally:
        await server.cleanup()


def test_a_header_names_an_s3_key_in_printable_ascii() -> None:
    assert _header("s3://scans/in/Café 1.pdf") == "s3://scans/in/Caf%C3%A9%201.pdf"
    uri = Path("/inbox/caf\xe9 #1.pdf").as_uri()  # a file's URI is encoded already: left as it is
    assert _header(uri) == uri


async def test_a_result_held_by_a_process_that_ended_before_the_move_names_the_moved_sidecars(
    tmp_path: Path, ledger: Ledger, job: Job, runners: list[HookRunner]
) -> None:
    out = tmp_path / "received"
    command = [sys.executable, script(tmp_path, "r.py", RECORDER), str(out)]
    archiver, moved_to = archived(tmp_path, job)
    # holds, and "dies" before the move
    ended = HookRunner([hook(command=command)], AsyncLedger(ledger), Metrics())
    await ended.hold(job, result(job), LocalSink())
    await ended.stop()
    ledger.mark_done(job.key)

    runner = HookRunner([hook(command=command)], AsyncLedger(ledger), Metrics())
    runners.append(runner)
    # the next start finds the document done and moves it
    await runner.relocate(job.key, settle(archiver, job))
    await runner.start()
    (received,) = await eventually(lambda: records(out), what="the hook's record")
    assert received["env"]["OCRWATCH_JSON"] == str(moved_to / "report.pdf.json")
    assert Path(received["env"]["OCRWATCH_MD"]).is_file()
    assert received["env"]["OCRWATCH_SOURCE"] == (moved_to / "report.pdf").as_uri()
    assert received["env"]["OCRWATCH_ORIGINAL"] == job.origin.uri


def test_s3_documents_name_their_sidecars_as_s3_uris() -> None:
    s3 = config.S3Config(
        queue_url="https://sqs.example/q", output_bucket="out", output_prefix="ocr/"
    )
    obj = Job(origin=S3Object(bucket="scans", key="in/Report 1.pdf", etag="e"), source="s3:0")
    where = sidecar_locations(S3Sink(s3, client=object()), obj)
    assert where == {
        "md": "s3://out/ocr/in/Report 1.pdf.md",
        "json": "s3://out/ocr/in/Report 1.pdf.json",
        "error": "s3://out/ocr/in/Report 1.pdf.error.json",
    }


def test_the_hook_keys_are_validated(tmp_path: Path) -> None:
    def load(text: str) -> config.Config:
        path = tmp_path / "ocrwatch.toml"
        path.write_text(text)
        return config.load(path)

    program = tmp_path / "bin" / "post.sh"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    cfg = load(
        '[[hook]]\ncommand = ["bin/post.sh", "--quiet"]\n[[hook]]\nurl = '
        '"https://chat.example:8443/hooks/ocr"\n'
        'token = "t"\non = ["failed"]\n'
    )
    # relative to the file, like every path in it
    assert cfg.hook[0].command == (str(program), "--quiet")
    assert (cfg.hook[0].name, cfg.hook[1].name, cfg.hook[1].on) == (
        "post.sh",
        "chat.example:8443",
        ("failed",),
    )
    assert "s3cret" not in repr(load('[[hook]]\nurl = "http://h/x"\ntoken = "s3cret"\n'))
    for text, said in (
        ("[[hook]]\n", "give exactly one of command"),
        ('[[hook]]\ncommand = ["/bin/true"]\nurl = "http://h/"\n', "give exactly one of command"),
        ("[[hook]]\ncommand = []\n", "a non-empty argv list"),
        ('[[hook]]\ncommand = ["bin/missing"]\n', "is not an executable file"),
        ('[[hook]]\nurl = "ftp://h/x"\n', "an http:// or https:// URL"),
        ('[[hook]]\ncommand = ["/bin/true"]\ntoken = "t"\n', "only for a url hook"),
        ('[[hook]]\ncommand = ["/bin/true"]\non = ["done"]\n', "hook[0].on[0]"),
        ('[[hook]]\ncommand = ["/bin/true"]\non = []\n', "at least one"),
        (
            '[[hook]]\ncommand = ["/bin/true"]\n[[hook]]\ncommand = ["/bin/true", "x"]\n',
            "hook[1].name: 'true' is",
        ),
        ('[[hook]]\ncommand = ["/bin/true"]\nmax_attempts = 0\n', "hook[0].max_attempts"),
        ('[[hook]]\ncommand = ["/bin/true"]\nshell = true\n', "hook[0].shell"),
    ):
        with pytest.raises(ConfigError, match=said.replace("[", r"\[").replace("]", r"\]")):
            load(text)


def test_the_example_configuration_documents_every_hook_key() -> None:
    text = (REPO / "config.example.toml").read_text()
    for key in HookConfig.model_fields:
        assert f"# {key} =" in text or f"{key} =" in text, (
            f"config.example.toml does not document hook.{key}"
        )
    assert "[[hook]]" in text
