"""Command line: ``run``, ``ocr``, ``status``, ``retry``, ``check``.

``ocr``, ``status`` and ``retry`` talk to the daemon that holds the state_dir, through its control
socket (``control``): ``ocr`` hands its files to the daemon's engine, since a GPU cannot hold a
second vLLM engine beside it, and ``retry`` starts the jobs at once. With no daemon running, ``ocr``
builds an engine of its own, and ``status`` and ``retry`` read and write the ledger. The exit codes
are ``EPILOG``'s, which ``--help`` prints. A reader of the output that goes away (``ocrwatch status
| head``) ends any command quietly (``streams``).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ocrwatch.config.engines as config_engines
from ocrwatch import __version__
from ocrwatch import config as config_module
from ocrwatch.app.report import OcrReport
from ocrwatch.config import DEFAULT_CONFIG_PATHS, Config, InboxConfig
from ocrwatch.config.roots import Root, prepare
from ocrwatch.errors import ConfigError, OcrwatchError
from ocrwatch.infra import streams
from ocrwatch.infra.logging import configure, say
from ocrwatch.sources.ignore import sidecar_suffixes

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from ocrwatch.control.client import Client
    from ocrwatch.control.protocol import OcrRequest
    from ocrwatch.store.ledger import Ledger

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CLOSED_PIPE = streams.EXIT_CLOSED_PIPE

EPILOG = """exit status:
  0    success (run: stopped cleanly)
  1    a document failed (ocr), a check failed (check), or a fault that may pass: a ledger
       that stayed locked, a daemon that did not answer, a start-up fault of the machine
  2    usage or configuration error, or a state_dir or ledger that cannot be used: fix it first
       (the systemd unit does not restart on 2)
  130  interrupted (Ctrl-C; run: a second Ctrl-C while it stops)
  141  the reader of the output went away (a closed pipe: ocrwatch status | head): the command
       stopped quietly at that write; run drains and stops as on SIGTERM"""

SEE_EXIT_CODES = "exit status: see ocrwatch --help"

CONFIG_HELP = (
    "TOML configuration file (default: "
    + ", else ".join(
        ["$OCRWATCH_CONFIG if set"]
        + [str(path) if path.is_absolute() else f"./{path}" for path in DEFAULT_CONFIG_PATHS]
        + ["the built-in defaults"]
    )
    + "; a file in the working folder that is not yours or root's, or that others may write, is"
    " passed over)"
)
"""The search order of ``config.load``, stated from the same constant."""

DEFAULT_PATTERNS = InboxConfig.model_fields["patterns"].default


class _Parser(argparse.ArgumentParser):
    """argparse drops a help or usage text whose write fails; here a closed pipe reaches ``main``
    as any other command's output does (its subparsers are of this class too)."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if message:
            (file or sys.stderr).write(message)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """A value outside the choices (a command, ``--engine``) is told the nearest one, as an
        unknown key or variable is: ``ocrwatch rnu`` meant ``run``."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            known = [str(choice) for choice in action.choices or ()]
            close = difflib.get_close_matches(str(value), known, n=1)
            if not close:
                raise
            raise argparse.ArgumentError(
                action, f"{exc.message}; did you mean `{close[0]}`?"
            ) from None


def _parser() -> argparse.ArgumentParser:
    common: dict[str, Any] = {
        "epilog": EPILOG,
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }
    parser = _Parser(
        prog="ocrwatch", description="Watch folders and buckets; OCR every new document.", **common
    )
    parser.add_argument("--version", action="version", version=f"ocrwatch {__version__}")
    # Before the command or after it (ocrwatch --config X status, ocrwatch status --config X): the
    # command's own does not default, so it never clears one given before it.
    parser.add_argument("--config", "-c", type=Path, help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        # the exit codes are stated once, in ``ocrwatch --help``
        p = sub.add_parser(name, help=text, description=text, epilog=SEE_EXIT_CODES)
        p.add_argument("--config", "-c", type=Path, default=argparse.SUPPRESS, help=CONFIG_HELP)
        return p

    command("run", "run the daemon")
    ocr = command(
        "ocr",
        "OCR the given files, and the documents in the given folders, once; a running daemon does "
        "the work",
    )
    ocr.add_argument(
        "--engine", choices=["auto", *config_engines.names()], help="override [engine] kind"
    )
    ocr.add_argument(
        "--lang",
        help="Tesseract language(s) for this run, e.g. deu or eng+deu, or auto: each page's "
        "from its script (selects Tesseract)",
    )
    ocr.add_argument(
        "--text",
        choices=["ocr", "auto", "layer"],
        help="a PDF page's text: OCR'd, its own text layer where good, or its layer where it has "
        "one "
        "(default: the inbox's [[inbox]] text, else the engine's: auto for Tesseract, ocr for "
        "vLLM)",
    )
    ocr.add_argument(
        "--out", type=Path, help="write sidecars under this folder instead of beside each file"
    )
    ocr.add_argument(
        "--pattern",
        action="append",
        metavar="GLOB",
        help="in a folder, take the files matching GLOB (repeatable; default: the patterns of the "
        "inbox the "
        f"folder lies in, else {' '.join(DEFAULT_PATTERNS)})",
    )
    ocr.add_argument(
        "--force", action="store_true", help="OCR again documents whose sidecars are current"
    )
    ocr.add_argument("paths", nargs="+", type=Path, metavar="FILE|DIR")
    status = command(
        "status", "the running documents, the queue by inbox and what the ledger holds"
    )
    status.add_argument("--json", action="store_true", help="print JSON")
    retry = command(
        "retry", "put failed jobs back in the queue; a running daemon starts them at once"
    )
    retry.add_argument(
        "paths", nargs="*", help="only these files or keys (default: every failed job)"
    )
    command("check", "validate the configuration and probe engine, folders and S3")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, load the configuration, run the command; a reader of stdout or stderr that went
    away ends it with ``EXIT_CLOSED_PIPE``, whichever write found out (``streams``), never with a
    traceback."""
    logs = streams.LogStream(sys.stderr)
    try:
        try:
            code = _main(argv, logs)
        finally:
            streams.flush()  # what is still buffered fails here, where it is caught, not at exit
    except BrokenPipeError:
        if not streams.silence_gone():  # not our output's reader: a fault to show
            raise
        return EXIT_CLOSED_PIPE
    if logs.closed:  # a log line found the reader gone and stopped the command
        return EXIT_CLOSED_PIPE if code in (EXIT_OK, EXIT_INTERRUPTED) else code
    return code


def _main(argv: list[str] | None, logs: streams.LogStream) -> int:
    args = _parser().parse_args(argv)
    if args.config is None:  # the file found is the one a reload reads again
        args.config, passed_over = config_module.discover()
        for line in passed_over:
            say(line, "warning")
    try:
        cfg = config_module.load(args.config)
    except ConfigError as exc:
        say(f"ocrwatch: invalid configuration:\n{exc.message}")
        return EXIT_USAGE
    logs.stop = signal.SIGTERM if args.command == "run" else signal.SIGINT  # run: drained
    log = cfg.log
    if args.command == "ocr" and sys.stderr.isatty() and log.level in ("debug", "info"):
        log = log.model_copy(update={"level": "warning"})  # the bar says what the info lines would
    configure(log, logs)  # type: ignore[arg-type]  # a TextIO in all that structlog uses
    command = {"run": _run, "ocr": _ocr, "status": _status, "retry": _retry, "check": _check}[
        args.command
    ]
    try:
        return command(cfg, args)
    except OcrwatchError as exc:
        say(f"ocrwatch: {exc.message} (hint: {exc.hint})")
        return _exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _exit_code(exc: OcrwatchError) -> int:
    """``EPILOG``'s code for a command stopped by ``exc``: 2 for what only the user can fix."""
    return EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_FAILED


def _run(cfg: Config, args: argparse.Namespace) -> int:
    from ocrwatch.app.daemon import Daemon

    return asyncio.run(Daemon(cfg, args.config).serve())


# --- ocr ------------------------------------------------------------------------------------------


def _ocr(cfg: Config, args: argparse.Namespace) -> int:
    from ocrwatch.control.client import Client
    from ocrwatch.control.protocol import OcrRequest

    missing = [path for path in args.paths if not path.exists()]
    if missing:
        for path in missing:
            say(f"ocrwatch: no such file: {path}")
        return EXIT_USAGE
    if args.lang is not None:
        _check_lang(cfg, args.lang, args.engine)
    cfg = _ocr_config(cfg, args)
    if args.out and cfg.output.dir is not None:  # a root as [output] dir is: made, then trusted
        out = Root("--out", cfg.output.dir, "folder", "the command line", make=True)
        prepare([out])
    files = _collect(cfg, args.paths, args.pattern)
    engine = "tesseract" if args.lang else None if args.engine in (None, "auto") else args.engine
    order = OcrRequest(
        files, cfg.output.dir if args.out else None, args.force, engine, args.lang, args.text
    )
    report = OcrReport(len(files))
    try:
        client = Client.connect(cfg.state_dir) if files else None
        if client is None or not _hand_over(client, order, report):
            if not args.out and cfg.output.dir is not None:  # written here: made, trusted as --out
                prepare([root for root in cfg.roots() if root.path == cfg.output.dir])
            asyncio.run(_ocr_here(cfg, order, report))
    except OcrwatchError as exc:  # an engine that cannot start, a daemon gone: files left counted
        report.finish(f"ocrwatch: {exc.message} (hint: {exc.hint})")
        return _exit_code(exc)
    return EXIT_FAILED if report.finish() else EXIT_OK


def _ocr_config(cfg: Config, args: argparse.Namespace) -> Config:
    """The configuration with this run's ``--engine``, ``--lang`` and ``--out``."""
    engine, set_by = cfg.engine, cfg.set_by
    if args.lang is not None:
        engine = engine.model_copy(
            update={
                "kind": "tesseract",
                "tesseract": engine.tesseract.model_copy(update={"lang": args.lang}),
            }
        )
        set_by += (("engine.kind", "--lang"),)
    elif args.engine:
        engine = engine.model_copy(update={"kind": args.engine})
        set_by += (("engine.kind", "--engine"),)  # what a message about the engine names
    output = cfg.output.model_copy(update={"dir": args.out.absolute()}) if args.out else cfg.output
    return cfg.model_copy(update={"engine": engine, "output": output, "set_by": set_by})


def _check_lang(cfg: Config, lang: str, engine: str | None) -> None:
    """``--lang``: Tesseract's, and only languages whose data is installed."""
    from ocrwatch.app import checks

    if engine not in (None, "auto", "tesseract"):
        raise ConfigError(
            f"--lang sets Tesseract's language, so it cannot go with --engine {engine}",
            hint="leave out --engine, or give --engine tesseract",
        )
    checks.require_languages(cfg, lang, kind="tesseract")


def _collect(cfg: Config, paths: list[Path], patterns: list[str] | None) -> list[tuple[Path, Path]]:
    """Each file to OCR with the folder it was found under: a named file's own folder, or the named
    folder it lies below (its sidecars are mirrored below ``--out`` from there). Each file once, in
    the order given."""
    found: dict[Path, Path] = {}
    for given in paths:
        path = Path(os.path.abspath(given))
        if path.is_dir():
            inbox = _inbox_of(cfg, path)
            wanted = tuple(patterns) if patterns else inbox.patterns
            scanned = inbox.model_copy(update={"patterns": wanted})
            documents = _scan(path, scanned, cfg.output.name_template)
            if not documents:
                say(f"ocrwatch: {given}: no documents matching {' '.join(wanted)}", "warning")
            for document in documents:
                found.setdefault(document, path)
        else:
            found.setdefault(path, path.parent)
    return list(found.items())


def _inbox_of(cfg: Config, folder: Path) -> InboxConfig:
    """The configured inbox ``folder`` lies in; the inbox defaults elsewhere."""
    resolved = folder.resolve()
    for inbox in cfg.inbox:
        if resolved.is_relative_to(inbox.path.expanduser().resolve()):
            return inbox
    return InboxConfig()


def _scan(root: Path, config: InboxConfig, template: str) -> list[Path]:
    """The documents below ``root``, in name order, by the inbox's own scan (``Inbox.scan``): its
    patterns, ignore names and depth, nothing hidden, no link followed; each refusal said once."""
    from ocrwatch.sources.inbox import Inbox

    try:
        found = Inbox(root, config, sidecar_suffixes(template)).scan(root)
    except OSError as exc:
        say(f"ocrwatch: {root}: cannot be listed: {exc.strerror}", "warning")
        return []
    for seen in sorted(seen for seen in found.values() if isinstance(seen, str)):
        say(f"ocrwatch: {seen}", "warning")
    return sorted(Path(path) for path, seen in found.items() if isinstance(seen, bytes))


def _hand_over(client: Client, order: OcrRequest, report: OcrReport) -> bool:
    """The files OCRed by the running daemon, its events shown as they come; False when the daemon
    declines (another engine or language asked for): they are then read here."""
    for event in client.request(order.as_json()):
        kind = event.get("event")
        if kind == "waiting":
            say(
                f"ocrwatch: the daemon (pid {event.get('pid')}) is starting its engine; waiting",
                "info",
            )
        elif kind == "declined":
            say(
                f"ocrwatch: {event.get('reason')}: reading here, with an engine of this run's own",
                "warning",
            )
            return False
        elif kind == "accepted":
            say(
                f"ocrwatch: handed {len(order.files)} file(s) to the running daemon (pid "
                f"{event.get('pid')}, "
                f"engine {event.get('engine')})",
                "info",
            )
        else:
            report.show(event)
    return True


async def _ocr_here(cfg: Config, order: OcrRequest, report: OcrReport) -> None:
    """No daemon runs (or it declined): this process builds the engine, only once a file needs
    it."""
    from ocrwatch.control.ocr import run_ocr
    from ocrwatch.infra.metrics import Metrics
    from ocrwatch.jobs.pipeline import Pipeline
    from ocrwatch.sinks.local import LocalSink

    pipeline = Pipeline(cfg, None, Metrics())

    async def prepare() -> None:
        from ocrwatch.app import checks

        # an engine that cannot start here is said with its fix before anything is made
        await asyncio.to_thread(checks.require_engine, cfg)
        # the documents' spool folders go there
        await asyncio.to_thread(_make_state_dir, cfg.state_dir)
        await pipeline.start()

    try:
        await run_ocr(
            pipeline,
            LocalSink(cfg.output.name_template, cfg.output.dir),
            order.files,
            force=order.force,
            emit=report.emit,
            lang=order.lang,
            before_first=prepare,
            text=order.text,
        )
    finally:
        await pipeline.close()


def _make_state_dir(state_dir: Path) -> None:
    """Create state_dir as the daemon does, mode 0700 with any missing parents: a daemon started
    later keeps its ledger and its control socket in the very folder this made."""
    from ocrwatch.store.ledger import StateUnusable, make_private_dirs

    try:
        make_private_dirs(state_dir)
    except OSError as exc:
        raise StateUnusable(
            f"state_dir: {exc.filename or state_dir} cannot be created: {exc.strerror or exc}",
            hint="make its parent folder writable by this user, or point state_dir at another "
            "folder",
        ) from None


# --- status and retry -----------------------------------------------------------------------------


def _existing_ledger(cfg: Config) -> Ledger:
    """The ledger; nothing is created here. ``ConfigError`` where no daemon has run with this
    state_dir, naming the configuration that chose it: the likeliest cause is a command run in
    another folder than the daemon's, which found another configuration or none."""
    from ocrwatch.store.ledger import Ledger

    path = cfg.state_dir / "ledger.sqlite3"
    try:
        os.stat(path)
    except FileNotFoundError:
        if cfg.source_file is not None:
            used = f"state_dir of {cfg.source_file.absolute()}"
        else:
            searched = ", ".join(str(p.absolute()) for p in DEFAULT_CONFIG_PATHS)
            used = f"the default state_dir: no configuration file read (looked for {searched})"
        raise ConfigError(
            f"no ledger at {path.absolute()}: no daemon has run with this state_dir ({used})",
            hint="give the daemon's configuration with --config FILE, or run this in the folder "
            "that holds its ocrwatch.toml",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"state_dir: {path} cannot be read: {exc.strerror}",
            hint=f"run as the user ocrwatch runs as, or make {cfg.state_dir} readable",
        ) from None
    return Ledger(path)


def _ask_daemon(cfg: Config, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The running daemon's one answer to ``payload``; None when no daemon holds the state_dir, or
    when one holds it but does not answer (said so: the ledger is used instead)."""
    from ocrwatch.control.client import Client
    from ocrwatch.control.protocol import ControlError

    try:
        client = Client.connect(cfg.state_dir)
        if client is None:
            return None
        for answer in client.request(payload):
            return answer
    except ControlError as exc:
        say(f"ocrwatch: {exc.message}; using the ledger", "warning")
    return None


def _status(cfg: Config, args: argparse.Namespace) -> int:
    from ocrwatch.control.status import ledger_status

    status = _ask_daemon(cfg, {"op": "status"})
    if status is None:
        ledger = _existing_ledger(cfg)
        try:
            status = ledger_status(ledger)
        finally:
            ledger.close()
    status.pop("event", None)
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return EXIT_OK
    daemon = status.get("daemon")
    if daemon is None:
        print("daemon: not running")
    else:
        print(
            f"daemon: {daemon['state']} (pid {daemon['pid']}, engine "
            f"{daemon['engine'] or 'not started'})"
        )
    for document in status.get("documents", []):
        total = document["pages_total"]
        pages = f"{document['pages_done']}/{total} pages" if total is not None else "preparing"
        if (eta := document.get("eta_seconds")) is not None:
            pages += f", about {eta:.0f} s left"
        print(f"running: {document['uri']} {pages}")
    for where, counts in sorted(status.get("queue", {}).items()):
        running = f"{counts['running']} running, " if daemon is not None else ""
        print(f"queue: {where}: {running}{counts['waiting']} waiting")
    for state, count in sorted(status.get("counts", {}).items()):
        print(f"{state:12} {count}")
    oldest = status.get("oldest_waiting")
    if oldest:  # a job not yet started (a running daemon's), or any unfinished one (none runs)
        print(f"oldest waiting: {oldest['key']} ({oldest['age']:.0f} s)")
    for error in status.get("last_errors", []):
        print(f"error: {error['kind']}: {error['message']} [{error['state']}] {error['key']}")
    return EXIT_OK


def _retry(cfg: Config, args: argparse.Namespace) -> int:
    # Absolute here: the daemon resolves them in a working directory of its own.
    selectors = [
        p if "://" in p else str(Path(p).expanduser().absolute()) for p in args.paths
    ] or None
    answer = _ask_daemon(cfg, {"op": "retry", "selectors": selectors})
    if answer is not None:
        count, pid = answer["count"], answer["pid"]
        _matched(count, selectors)
        said = {
            "running": f"the running daemon (pid {pid}) started them",
            "starting": f"the daemon (pid {pid}) starts them once it is ready",
        }.get(answer["state"], f"the daemon (pid {pid}) is stopping: its next start picks them up")
        print(f"{count} job(s) queued again; {said}")
        return EXIT_OK
    ledger = _existing_ledger(cfg)
    try:
        count = ledger.retry(selectors)
    finally:
        ledger.close()
    _matched(count, selectors)
    from ocrwatch.control.client import daemon_holds

    if daemon_holds(cfg.state_dir):  # it did not answer (said above)
        print(f"{count} job(s) queued again; the daemon starts them at its next start or scan")
    else:
        print(
            f"{count} job(s) queued again; no daemon is running: the next `ocrwatch run` starts "
            "them"
        )
    return EXIT_OK


def _matched(count: int, selectors: list[str] | None) -> None:
    """``ConfigError`` where the files or keys named matched no failed job: a path mistyped, or run
    from another folder, is said as such, not as a retry that did nothing."""
    if count == 0 and selectors:
        raise ConfigError(
            f"no failed job matches {', '.join(selectors)} (a job's file or key, or a folder or"
            " prefix it lies below)",
            hint="`ocrwatch status` lists the failed jobs with their errors; only a failed job is"
            " queued again",
        )


def _check(cfg: Config, args: argparse.Namespace) -> int:
    """One line per check, passed or failed, each as soon as it is known; exit 1 when any failed."""
    from ocrwatch.app import checks

    failed = False
    for result in checks.run(cfg):
        print(result.line(), flush=True)
        failed = failed or not result.ok
    return EXIT_FAILED if failed else EXIT_OK
