"""Command line: ``run``, ``ocr``, ``status``, ``retry``, ``check``.

Exit codes: 0 ok; 1 a document failed, or a fault that may pass (the ledger stayed locked); 2 what the user
must fix first: the configuration, or a state_dir or ledger that cannot be used. Each error is one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ocrwatch import __version__, config as config_module
from ocrwatch.config import Config
from ocrwatch.engines.base import Engine
from ocrwatch.errors import ConfigError, OcrwatchError
from ocrwatch.logging import configure
from ocrwatch.sinks.local import LocalSink
from ocrwatch.sources.base import Job

if TYPE_CHECKING:
    from ocrwatch.ledger import Ledger

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

log = structlog.get_logger()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ocrwatch", description="Watch folders and buckets; OCR every new document.")
    parser.add_argument("--version", action="version", version=f"ocrwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", "-c", type=Path, help="TOML configuration file (default: built-in defaults)")
        return p

    with_config(sub.add_parser("run", help="run the daemon"))
    ocr = with_config(sub.add_parser("ocr", help="OCR the given files once and write their sidecars"))
    ocr.add_argument("--engine", choices=["auto", "tesseract", "vllm"], help="override [engine] kind")
    ocr.add_argument("--out", type=Path, help="write sidecars under this folder instead of beside each file")
    ocr.add_argument("files", nargs="+", type=Path)
    status = with_config(sub.add_parser("status", help="what the ledger holds"))
    status.add_argument("--json", action="store_true", help="print JSON")
    retry = with_config(sub.add_parser("retry", help="put failed jobs back in the queue"))
    retry.add_argument("paths", nargs="*", help="only these files or keys (default: every failed job)")
    with_config(sub.add_parser("check", help="validate the configuration and probe engine, folders and S3"))
    return parser


def _load(args: argparse.Namespace) -> Config:
    cfg = config_module.load(args.config)
    if getattr(args, "engine", None):
        cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"kind": args.engine})})
    if getattr(args, "out", None):
        cfg = cfg.model_copy(update={"output": cfg.output.model_copy(update={"dir": args.out.absolute()})})
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = _load(args)
    except ConfigError as exc:
        print(f"ocrwatch: invalid configuration:\n{exc.message}", file=sys.stderr)
        return EXIT_USAGE
    configure(cfg.log)
    command = {"run": _run, "ocr": _ocr, "status": _status, "retry": _retry, "check": _check}[args.command]
    try:
        return command(cfg, args)
    except OcrwatchError as exc:
        print(f"ocrwatch: {exc.message} (hint: {exc.hint})", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def _run(cfg: Config, args: argparse.Namespace) -> int:
    from ocrwatch.daemon import Daemon

    return asyncio.run(Daemon(cfg, args.config).serve())


def _ocr(cfg: Config, args: argparse.Namespace) -> int:
    missing = [path for path in args.files if not path.exists()]
    if missing:
        for path in missing:
            print(f"ocrwatch: no such file: {path}", file=sys.stderr)
        return EXIT_USAGE
    bar = _progress(len(args.files))

    def on_done(job: Job, status: str) -> None:
        if bar is not None:
            bar.update(1)

    results = asyncio.run(ocr_files(cfg, args.files, on_done=on_done))
    if bar is not None:
        bar.close()
    sink = LocalSink(cfg.output.name_template, cfg.output.dir)
    failed = [job for job, status in results if status == "failed"]
    for job in failed:
        print(f"ocrwatch: {job.origin.name}: {_failure(sink.paths(job)['error'])}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


async def ocr_files(
    cfg: Config, paths: Iterable[Path], *, on_done: Callable[[Job, str], None] | None = None
) -> list[tuple[Job, str]]:
    """One-shot OCR of the given files (``ocrwatch ocr``): the daemon's pipeline, without ledger or watching."""
    from ocrwatch.metrics import Metrics
    from ocrwatch.pipeline import Pipeline
    from ocrwatch.sources.files import GivenFiles

    pipeline = Pipeline(cfg, None, Metrics())
    await pipeline.start()
    source = GivenFiles(list(paths))
    pipeline.add_source(source, LocalSink(cfg.output.name_template, cfg.output.dir))
    results: list[tuple[Job, str]] = []  # here, not in the pipeline: a daemon's pipeline would keep every job
    try:
        tasks = [(job, pipeline.start_job(job)) for job in source.jobs()]
        for job, task in tasks:
            status = await task
            results.append((job, status))
            if on_done is not None:
                on_done(job, status)
        return results
    finally:
        await pipeline.close()


def _failure(error_sidecar: Path) -> str:
    """The kind, message and hint of a failure, as its error sidecar records them."""
    try:
        error = json.loads(error_sidecar.read_text())["error"]
    except (OSError, ValueError, KeyError):
        return "failed (the file disappeared or no error sidecar could be written; see the log)"
    return f"{error['kind']}: {error['message']} (hint: {error['hint']})"


def _progress(total: int) -> object | None:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="doc", file=sys.stderr)


def _existing_ledger(cfg: Config) -> Ledger | None:
    """The ledger; None (and said so) where no daemon has run with this state_dir: nothing is created here."""
    from ocrwatch.ledger import Ledger

    path = cfg.state_dir / "ledger.sqlite3"
    try:
        os.stat(path)
    except FileNotFoundError:
        print(f"no ledger at {path}: the daemon has not run with this state_dir")
        return None
    except OSError as exc:
        raise ConfigError(
            f"state_dir: {path} cannot be read: {exc.strerror}",
            hint=f"run as the user ocrwatch runs as, or make {cfg.state_dir} readable",
        ) from None
    return Ledger(path)


def _status(cfg: Config, args: argparse.Namespace) -> int:
    ledger = _existing_ledger(cfg)
    if ledger is None:
        return EXIT_OK
    try:
        summary = ledger.summary()
    finally:
        ledger.close()
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return EXIT_OK
    for state, count in sorted(summary.get("counts", {}).items()):
        print(f"{state:12} {count}")
    oldest = summary.get("oldest_waiting")
    if oldest:
        print(f"oldest waiting: {oldest['key']} ({oldest['age']:.0f} s)")
    for error in summary.get("last_errors", []):
        print(f"error: {error['kind']}: {error['message']} [{error['state']}] {error['key']}")
    return EXIT_OK


def _retry(cfg: Config, args: argparse.Namespace) -> int:
    ledger = _existing_ledger(cfg)
    if ledger is None:
        return EXIT_OK
    try:
        selectors = [str(Path(p).absolute()) if Path(p).exists() else p for p in args.paths] or None
        count = ledger.retry(selectors)
    finally:
        ledger.close()
    print(f"{count} job(s) queued again; a running daemon picks them up at its next reconciliation or restart")
    return EXIT_OK


def _check(cfg: Config, args: argparse.Namespace) -> int:
    from ocrwatch.engines import registry

    problems: list[str] = []
    kind, reason = registry.choose(cfg.engine)
    print(f"engine: {kind} ({reason})")
    try:
        engine = registry.build(cfg.engine, cfg.output.images, kind=kind)
        asyncio.run(_probe_engine(engine))
        print(f"engine: ok {engine.describe()}")
    except OcrwatchError as exc:
        problems.append(f"engine: {exc.kind}: {exc.message} ({exc.hint})")
    for inbox in cfg.inbox:
        if not inbox.path.is_dir() and not inbox.create:
            problems.append(f"inbox {inbox.path}: not a folder")
        else:
            print(f"inbox: {inbox.path}")
    if cfg.s3:
        from ocrwatch import s3client

        for s3cfg in cfg.s3:
            problems.extend(s3client.check(s3cfg))
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return EXIT_FAILED if problems else EXIT_OK


async def _probe_engine(engine: Engine) -> None:
    await engine.start()
    await engine.close()
