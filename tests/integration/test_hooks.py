"""Completion hooks through ``ocrwatch run`` as a real process: a command that records what it got,
a webhook on 127.0.0.1 that fails twice, a daemon killed with SIGKILL while its hook runs, and a
hook for an S3 document."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import tomli_w

from tests.integration.conftest import REPO, DaemonProcess, alive, free_port, wait_until
from tests.support import docs
from tests.test_hooks import FAILER, RECORDER, minimal_environment, records, script

pytestmark = pytest.mark.integration

FAST_RETRY = {"max_attempts": 2, "backoff_initial_seconds": 0.1, "backoff_max_seconds": 0.5}

SLOW_WHILE_FLAGGED = """
import os, sys, time
log, flag = sys.argv[1], sys.argv[2]
size = len(sys.stdin.buffer.read())
with open(log, "a") as f:
    f.write(f"start {os.getpid()}\\n")
while os.path.exists(flag):
    time.sleep(0.05)
with open(log, "a") as f:
    f.write(f"done {os.getpid()} {size}\\n")
"""


def deliveries(daemon: DaemonProcess) -> list[dict[str, Any]]:
    path = daemon.state / "ledger.sqlite3"
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        try:
            return [
                dict(r)
                for r in conn.execute(
                    "SELECT e.key, e.status, d.hook, d.state, d.attempts FROM hook_deliveries d"
                    " JOIN hook_events e ON e.id = d.event ORDER BY e.id, d.hook"
                )
            ]
        except sqlite3.OperationalError:  # the tables are not there yet
            return []


def job_state(daemon: DaemonProcess, path: Path) -> str:
    with sqlite3.connect(daemon.state / "ledger.sqlite3") as conn:
        return str(
            conn.execute("SELECT state FROM jobs WHERE key = ?", (path.as_uri(),)).fetchone()[0]
        )


def sample(metrics: str, name: str, **labels: str) -> float | None:
    wanted = "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}"
    for line in metrics.splitlines():
        if line.startswith(name + wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_hooks_get_each_result_filtered_by_status_and_a_failing_hook_leaves_the_document_ok(
    plugin_daemon: Any, tmp_path: Path
) -> None:
    every, failures = tmp_path / "every", tmp_path / "failures"
    hostile = [
        f"$(touch {tmp_path}/by-subshell)",
        f"; touch {tmp_path}/by-semicolon",
        "*.png",
        "two words",
        "",
    ]
    recorder = script(tmp_path, "record.py", RECORDER)
    daemon = plugin_daemon(
        hook=[
            {"name": "record", "command": [sys.executable, recorder, str(every), *hostile]},
            {
                "name": "failures",
                "command": [sys.executable, recorder, str(failures)],
                "on": ["failed"],
            },
            {
                "name": "broken",
                "command": [sys.executable, script(tmp_path, "fail.py", FAILER)],
                **FAST_RETRY,
            },
        ]
    ).start()
    try:
        good = docs.write_png(daemon.inbox / "good.png", ["Invoice 42", "Total due"])
        bad = docs.write_corrupt_pdf(daemon.inbox / "bad.pdf")
        got = wait_until(
            lambda: len(records(every)) == 2 and records(every), 60, "both results at the hook"
        )
        settled = wait_until(
            lambda: (
                (rows := deliveries(daemon)) and all(r["state"] != "pending" for r in rows) and rows
            ),
            60,
            "every delivery finished",
        )
        by_status = {record["env"]["OCRWATCH_STATUS"]: record for record in got}

        ok = by_status["ok"]
        assert ok["stdin"].encode() == good.with_name("good.png.json").read_bytes()
        assert ok["env"] == {
            "OCRWATCH_STATUS": "ok",
            "OCRWATCH_SOURCE": good.as_uri(),
            "OCRWATCH_ORIGINAL": good.as_uri(),
            "OCRWATCH_JSON": str(good.with_name("good.png.json")),
            "OCRWATCH_MD": str(good.with_name("good.png.md")),
        }
        assert ok["argv"] == hostile
        assert not (tmp_path / "by-subshell").exists() and not (tmp_path / "by-semicolon").exists()

        failed = by_status["failed"]
        assert failed["stdin"].encode() == bad.with_name("bad.pdf.error.json").read_bytes()
        assert failed["env"]["OCRWATCH_JSON"] == str(bad.with_name("bad.pdf.error.json"))
        assert (
            failed["env"]["OCRWATCH_MD"] == "" and failed["env"]["OCRWATCH_SOURCE"] == bad.as_uri()
        )

        (only,) = records(failures)  # on = ["failed"]: never run for the ok document
        assert only["env"]["OCRWATCH_STATUS"] == "failed"
        assert {(r["key"], r["hook"]) for r in settled if r["hook"] == "failures"} == {
            (bad.as_uri(), "failures")
        }

        broken = [r for r in settled if r["hook"] == "broken"]
        assert [(r["state"], r["attempts"]) for r in broken] == [("failed", 2), ("failed", 2)]
        assert json.loads(good.with_name("good.png.json").read_text())["status"] == "ok"
        assert job_state(daemon, good) == "done"
        hook_failed = [e for e in daemon.events() if e.get("event") == "hook_failed"]
        assert {e["uri"] for e in hook_failed} == {good.as_uri(), bad.as_uri()}
        assert all("exit status 3: the ticket system said no" in e["error"] for e in hook_failed)
        metrics = daemon.metrics()
        assert (
            sample(metrics, "ocrwatch_hook_deliveries_total", hook="broken", outcome="failed") == 2
        )
        assert (
            sample(metrics, "ocrwatch_hook_deliveries_total", hook="record", outcome="delivered")
            == 2
        )
        assert sample(metrics, "ocrwatch_documents_total", status="ok") == 1
    finally:
        assert daemon.stop() == 0


def test_a_hook_after_a_move_is_told_where_source_and_sidecars_are_now_and_where_it_was_dropped(
    plugin_daemon: Any, tmp_path: Path
) -> None:
    out, archive = tmp_path / "received", tmp_path / "archive"
    command = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out)]
    daemon = plugin_daemon(
        hook=[{"name": "record", "command": command}],
        output={"archive_dir": str(archive), "on_success": "move"},
    ).start()
    try:
        source = docs.write_png(daemon.inbox / "scan é.png", ["Archived then hooked"])
        (received,) = wait_until(lambda: records(out), 60, "the hook's record")
        there = archive / "inbox" / "scan é.png"
        env = received["env"]
        assert (
            env["OCRWATCH_SOURCE"] == there.as_uri() and env["OCRWATCH_ORIGINAL"] == source.as_uri()
        )
        assert (
            Path(unquote(urlsplit(env["OCRWATCH_SOURCE"]).path)).read_bytes() == there.read_bytes()
        )
        assert not source.exists()
        assert env["OCRWATCH_JSON"] == str(there.with_name("scan é.png.json"))
        assert env["OCRWATCH_MD"] == str(there.with_name("scan é.png.md"))
        # the very sidecar, moved
        assert Path(env["OCRWATCH_JSON"]).read_text() == received["stdin"]
        # where it was read
        assert json.loads(received["stdin"])["source"]["uri"] == source.as_uri()
        delivered = wait_until(
            lambda: [e for e in daemon.events() if e.get("event") == "hook_delivered"],
            30,
            "the delivery logged",
        )
        assert [(e["uri"], e["job_id"]) for e in delivered] == [
            (source.as_uri(), job_id_of(daemon, source))
        ]
    finally:
        assert daemon.stop() == 0


def job_id_of(daemon: DaemonProcess, source: Path) -> str:
    """The job id the daemon's own lines about ``source`` carry."""
    started = [
        e
        for e in daemon.events()
        if e.get("event") == "job_started" and e["uri"] == source.as_uri()
    ]
    return str(started[0]["job_id"])


class FlakyReceiver(BaseHTTPRequestHandler):
    """Answers 500 to the first two POSTs, then 200; records each."""

    seen: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((dict(self.headers), body))
        status = 500 if len(self.seen) <= 2 else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"no" if status == 500 else b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    seen: list[tuple[dict[str, str], bytes]] = []
    handler = type("Receiver", (FlakyReceiver,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/tickets", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_webhook_answered_500_twice_then_200_is_recorded_as_one_delivery_done(
    plugin_daemon: Any, receiver: tuple[str, list[tuple[dict[str, str], bytes]]]
) -> None:
    url, seen = receiver
    daemon = plugin_daemon(
        hook=[
            {
                "name": "tickets",
                "url": url,
                "token": "t0ken",
                "on": ["ok", "partial"],
                "backoff_initial_seconds": 0.1,
                "backoff_max_seconds": 0.5,
            }
        ]
    ).start()
    try:
        source = docs.write_png(daemon.inbox / "scan.png", ["Ticket body"])
        wait_until(
            lambda: deliveries(daemon) and deliveries(daemon)[0]["state"] == "done",
            60,
            "the delivery done",
        )
        assert deliveries(daemon) == [
            {
                "key": source.as_uri(),
                "status": "ok",
                "hook": "tickets",
                "state": "done",
                "attempts": 3,
            }
        ]
        assert len(seen) == 3
        sidecar = source.with_name("scan.png.json").read_bytes()
        for headers, body in seen:
            assert body == sidecar
            assert (
                headers["Content-Type"] == "application/json"
                and headers["Authorization"] == "Bearer t0ken"
            )
            assert headers["Ocrwatch-Status"] == "ok"
            assert headers["Ocrwatch-Source"] == headers["Ocrwatch-Original"] == source.as_uri()
        metrics = daemon.metrics()
        assert sample(metrics, "ocrwatch_hook_attempts_total", hook="tickets", result="error") == 2
        assert sample(metrics, "ocrwatch_hook_attempts_total", hook="tickets", result="ok") == 1
        assert (
            sample(metrics, "ocrwatch_hook_deliveries_total", hook="tickets", outcome="delivered")
            == 1
        )
        assert sample(metrics, "ocrwatch_hook_pending", hook="tickets") == 0
        assert [e["attempts"] for e in daemon.events() if e.get("event") == "hook_delivered"] == [3]
    finally:
        assert daemon.stop() == 0


def test_a_daemon_killed_while_its_hook_runs_runs_the_hook_again_after_the_restart(
    plugin_daemon: Any, tmp_path: Path
) -> None:
    log, flag = tmp_path / "hook.log", tmp_path / "hold-the-hook"
    flag.touch()
    command = [sys.executable, script(tmp_path, "slow.py", SLOW_WHILE_FLAGGED), str(log), str(flag)]
    daemon = plugin_daemon(hook=[{"name": "slow", "command": command}]).start()
    source = docs.write_png(daemon.inbox / "late.png", ["Killed mid-hook"])
    wait_until(lambda: log.exists() and "start" in log.read_text(), 60, "the hook running")
    # the sidecars are written: only the hook is left
    assert source.with_name("late.png.json").exists()
    daemon.kill()  # SIGKILL: no clean-up of any kind
    flag.unlink()  # the orphaned hook may now finish too: at least once, not exactly once

    daemon.start()
    wait_until(
        lambda: deliveries(daemon) and deliveries(daemon)[0]["state"] == "done",
        60,
        "the hook delivered",
    )
    (row,) = deliveries(daemon)
    assert row["attempts"] == 2  # the one the kill interrupted, and the one after the restart
    delivered = [e for e in daemon.events() if e.get("event") == "hook_delivered"]
    assert [e["uri"] for e in delivered] == [source.as_uri()]
    lines = log.read_text().splitlines()
    assert sum(line.startswith("start") for line in lines) >= 2
    size = len(source.with_name("late.png.json").read_bytes())
    assert f"{size}" in {line.split()[2] for line in lines if line.startswith("done")}
    assert daemon.stop() == 0


@pytest.mark.s3
def test_a_hook_runs_for_an_s3_document_with_s3_uris(moto: Any, tmp_path: Path) -> None:
    from tests.integration.test_s3_daemon import sidecar, sqs_daemon

    out = tmp_path / "received"
    queue = moto.bucket_with_queue("docs", "events")
    command = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out)]
    daemon = sqs_daemon(
        tmp_path, moto, queue, hook=[{"name": "record", "command": command}]
    ).start()
    try:
        s3, key = moto.client("s3"), "scans/hooked.png"
        s3.put_object(
            Bucket="docs",
            Key=key,
            Body=docs.write_png(tmp_path / "p.png", ["S3 hook"]).read_bytes(),
        )
        (received,) = wait_until(lambda: records(out), 90, "the hook's record")
        assert received["env"] == {
            "OCRWATCH_STATUS": "ok",
            "OCRWATCH_SOURCE": f"s3://docs/{key}",
            "OCRWATCH_ORIGINAL": f"s3://docs/{key}",
            "OCRWATCH_JSON": f"s3://docs/{key}.json",
            "OCRWATCH_MD": f"s3://docs/{key}.md",
        }
        assert json.loads(received["stdin"]) == sidecar(s3, "docs", f"{key}.json")
    finally:
        assert daemon.stop() == 0


@pytest.mark.s3
def test_a_hook_gets_none_of_the_secrets_the_daemon_was_given_by_environment(
    moto: Any, tmp_path: Path
) -> None:
    """The guide's way (docs/guide.md): secrets in variables, not in the file. The daemon uses them
    (it reads the bucket with the key, listens with the token), and the hook gets its own variables
    and a minimal environment, none of them."""
    from tests.integration.test_s3_daemon import sqs_daemon

    out = tmp_path / "received"
    queue = moto.bucket_with_queue("docs", "events")
    command = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out)]
    webhook = {
        **{key: value for key, value in moto.s3_config().items() if key != "secret_access_key"},
        "transport": "webhook",
        "listen": f"127.0.0.1:{free_port()}",
    }
    daemon = sqs_daemon(tmp_path, moto, queue, hook=[{"name": "record", "command": command}])
    daemon.config_path.write_text(
        daemon.config_path.read_text().replace('secret_access_key = "testing"\n', "")
        + "\n"
        + tomli_w.dumps({"s3": [webhook]})
    )
    assert "secret_access_key" not in daemon.config_path.read_text()
    kept = minimal_environment(tmp_path)
    (tmp_path / "credentials").mkdir()
    given = {
        **kept,
        "OCRWATCH_S3_0_SECRET_ACCESS_KEY": "testing",
        "OCRWATCH_S3_1_SECRET_ACCESS_KEY": "testing",
        "OCRWATCH_S3_1_TOKEN": "webhook-token-by-environment",
        "OCRWATCH_LOG_LEVEL": "debug",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "CREDENTIALS_DIRECTORY": str(tmp_path / "credentials"),
        "DATABASE_PASSWORD": "an-unrelated-secret",
    }
    daemon.start(env=given)
    try:
        key = "scans/secret.png"
        moto.client("s3").put_object(
            Bucket="docs", Key=key, Body=docs.write_png(tmp_path / "p.png", ["Secret"]).read_bytes()
        )
        (received,) = wait_until(lambda: records(out), 90, "the hook's record")
        assert received["environ"] == {
            **kept,
            "OCRWATCH_STATUS": "ok",
            "OCRWATCH_SOURCE": f"s3://docs/{key}",
            "OCRWATCH_ORIGINAL": f"s3://docs/{key}",
            "OCRWATCH_JSON": f"s3://docs/{key}.json",
            "OCRWATCH_MD": f"s3://docs/{key}.md",
        }
    finally:
        assert daemon.stop() == 0


def test_files_handed_over_by_ocrwatch_ocr_run_no_hooks_as_without_a_daemon(
    plugin_daemon: Any, tmp_path: Path
) -> None:
    out = tmp_path / "received"
    command = [sys.executable, script(tmp_path, "record.py", RECORDER), str(out)]
    daemon = plugin_daemon(hook=[{"name": "record", "command": command}]).start()
    try:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        given = docs.write_png(elsewhere / "given.png", ["Handed over"])
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        ran = subprocess.run(
            [
                sys.executable,
                "-m",
                "ocrwatch",
                "ocr",
                "--config",
                str(daemon.config_path),
                str(given),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": pythonpath},
        )
        assert ran.returncode == 0, ran.stderr
        assert given.with_name("given.png.json").exists()
        watched = docs.write_png(daemon.inbox / "watched.png", ["Dropped in the inbox"])
        (received,) = wait_until(lambda: records(out), 60, "the inbox document's hook")
        assert received["env"]["OCRWATCH_SOURCE"] == watched.as_uri()
        assert [row["key"] for row in deliveries(daemon)] == [watched.as_uri()]
        # the daemon did process it
        assert any(e.get("uri") == given.as_uri() for e in daemon.events())
    finally:
        assert daemon.stop() == 0


def test_what_a_hook_leaves_running_is_killed_when_it_exits_and_when_the_daemon_stops(
    plugin_daemon: Any, tmp_path: Path
) -> None:
    left, held = tmp_path / "left.pid", tmp_path / "held.pid"
    leaver = ["/bin/sh", "-c", 'sleep 120 & echo $! > "$1"', "sh", str(left)]
    holder = ["/bin/sh", "-c", 'sleep 120 & echo "$$ $!" > "$1"; wait', "sh", str(held)]
    hooks = [{"name": "leaver", "command": leaver}, {"name": "holder", "command": holder}]
    daemon = plugin_daemon(hook=hooks).start()

    def both_ran() -> bool:
        done = ("leaver", "done") in [(row["hook"], row["state"]) for row in deliveries(daemon)]
        return done and held.exists() and len(held.read_text().split()) == 2

    try:
        docs.write_png(daemon.inbox / "scan.png", ["Hooked"])
        wait_until(both_ran, 60, "both hooks run")
        wait_until(lambda: not alive(int(left.read_text())), 10, "the leaver's sleep killed")
        pids = [int(pid) for pid in held.read_text().split()]
        assert all(alive(pid) for pid in pids)  # the holder still runs, with its child
    finally:
        assert daemon.stop() == 0
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "the holder and its child killed")
