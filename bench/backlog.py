"""A backlog dropped at once: how much memory does each queued file cost, and how long does a stop
take?

``--files`` one-line PNGs are renamed into ``--folders`` folders of the inbox at once. The engine
never answers (``tests.support.fault_engines:HangingEngine``), so the first ``max_active_documents``
documents hold their slots and every other file waits. Once the ledger holds every file, the
daemon's RSS growth over its RSS before the drop is divided by the files; then SIGTERM, timed to the
exit, with ``shutdown_timeout = 10``. Target (issue 24): growth under 2 KB a file (200 MiB at most
for 100,000); the stop within ``shutdown_timeout`` + a few seconds, with one summary line for the
jobs left queued rather than one ``job_interrupted`` line each. Settings: defaults, except the
engine, ``settle_seconds = 0.3`` and ``reconcile_seconds = 3600`` (the watcher alone admits the
files).

    python bench/backlog.py [--files 100000] [--folders 100]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import tempfile
import time
from contextlib import closing
from pathlib import Path

from common import REPO, Daemon, emit, machine, wait_for
from PIL import Image


def admitted(ledger: Path) -> int:
    """Rows in the ledger, read as ``ocrwatch status`` reads it (WAL: never in the daemon's way)."""
    if not ledger.exists():
        return 0
    with closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=5)) as conn:
        return int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--folders", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the admission")
    args = parser.parse_args()
    paths = [str(REPO), os.environ.get("PYTHONPATH")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))  # the engine is a test's
    with tempfile.TemporaryDirectory(prefix="ocrwatch-bench-") as tmp:
        scratch = Path(tmp)
        page = scratch / "page.png"
        Image.new("L", (64, 32), 255).save(page)
        data = page.read_bytes()
        staged = scratch / "staged"
        folders = [staged / f"folder-{n:03d}" for n in range(args.folders)]
        for folder in folders:
            folder.mkdir(parents=True)
        for number in range(args.files):
            (folders[number % args.folders] / f"page-{number:06d}.png").write_bytes(data)
        engine = {
            "kind": "plugin",
            "plugin": "tests.support.fault_engines:HangingEngine",
            "plugin_args": {"match": "."},
        }
        stop = {"shutdown_timeout": 10.0, "reconcile_seconds": 3600.0}
        daemon = Daemon(scratch / "run", engine=engine, daemon=stop)
        daemon.start()
        try:
            time.sleep(2.0)
            rss_before = daemon.rss_bytes()
            started = time.monotonic()
            for folder in folders:
                (daemon.inbox / folder.name).mkdir()
            for folder in folders:
                for path in folder.iterdir():
                    path.rename(daemon.inbox / folder.name / path.name)
            ledger = daemon.root / "state" / "ledger.sqlite3"
            seen = 0

            def all_in() -> bool:
                nonlocal seen
                now = admitted(ledger)
                if now // 10_000 > seen // 10_000:
                    print(
                        f"{now} admitted after {time.monotonic() - started:.0f} s, "
                        f"RSS {daemon.rss_bytes() / 2**20:.0f} MiB",
                        flush=True,
                    )
                seen = now
                return now >= args.files

            wait_for(all_in, args.timeout, "every file in the ledger", interval=1.0)
            admit_seconds = time.monotonic() - started
            time.sleep(5.0)  # the last settle tasks end, the heap trimmer runs
            rss_after, rss_peak = daemon.rss_bytes(), peak_rss(daemon.pid)
            assert daemon.proc is not None
            stop_started = time.monotonic()
            daemon.proc.send_signal(signal.SIGTERM)
            code = daemon.proc.wait(300)
            stop_seconds = time.monotonic() - stop_started
        finally:
            daemon.stop()
        events = []
        for line in daemon.log_path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    growth = rss_after - rss_before
    left = [e for e in events if e.get("event") == "jobs_left_queued"]
    print(
        f"{args.files} files admitted in {admit_seconds:.0f} s; RSS {rss_before / 2**20:.0f} → "
        f"{rss_after / 2**20:.0f} MiB ({growth / args.files:.0f} B a file), "
        f"peak {rss_peak / 2**20:.0f} MiB; "
        f"stop in {stop_seconds:.1f} s, exit {code}"
    )
    emit(
        {
            "bench": "backlog",
            "files": args.files,
            "folders": args.folders,
            "admit_seconds": round(admit_seconds, 1),
            "rss_before_mib": round(rss_before / 2**20, 1),
            "rss_after_mib": round(rss_after / 2**20, 1),
            "rss_peak_mib": round(rss_peak / 2**20, 1),
            "rss_growth_bytes_per_file": round(growth / args.files),
            "target_bytes_per_file": 2048,
            "stop_seconds": round(stop_seconds, 1),
            "exit_code": code,
            "job_interrupted_lines": sum(e.get("event") == "job_interrupted" for e in events),
            "jobs_left_queued": left[-1].get("jobs") if left else None,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
