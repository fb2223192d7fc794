"""What a start needs, checked: ``ocrwatch check`` prints every check, one line each, and the daemon
runs those only the user can fix before it starts anything (``preflight``), so that each stops the
start with one line naming the file and the key (exit 2) instead of a traceback, or a document
failing hours later.

A check yields ``Check``s. Folders are probed by making and removing a hidden file in them (as the
user this runs as: run ``check`` as the service user); listen addresses by binding them as the
listeners will (one in use by the daemon holding state_dir, by its answer on the control socket, is
its own); S3 by one call per endpoint, queue and bucket. ``check`` changes nothing: a folder that
does not exist yet is judged by the nearest folder above it, where ``preflight`` creates it as the
daemon would.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import getpass
import importlib.util
import itertools
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import structlog

import ocrwatch.config.roots as roots
from ocrwatch import control
from ocrwatch.config import Config, InboxConfig, S3Config
from ocrwatch.config.env import Loc
from ocrwatch.engines import registry
from ocrwatch.engines.base import Check, command_output
from ocrwatch.errors import ConfigError, OcrwatchError
from ocrwatch.infra import children
from ocrwatch.infra.http import host_port


def run(cfg: Config) -> Iterator[Check]:
    """Every check ``ocrwatch check`` prints, in order, each as soon as it is known."""
    yield Check(True, "config", f"{cfg.source_file or 'built-in defaults'} is valid")
    found = cfg.roots()
    problems: dict[str, list[roots.Problem]] = {}
    for problem in roots.check(found):
        problems.setdefault(problem.root.key, []).append(problem)
    yield from _files(found, problems)
    yield from _poppler(cfg)
    yield from _engine(cfg, probe=True)
    yield from _folders(cfg, prepare=False, problems=problems)
    yield from _listens(cfg, functools.cache(functools.partial(_daemon_listening, cfg.state_dir)))
    try:
        probed = cfg.with_secrets()
    except OcrwatchError:  # a FAIL line above says why; probed without it
        probed = cfg
    for index, s3 in enumerate(probed.s3):
        yield from _s3(index, s3)


def preflight(cfg: Config) -> None:
    """Raise one ``ConfigError`` naming every problem a start would meet that only the user can fix,
    a line each (a start refused for one would only meet the next, which ``check`` lists too): a
    missing poppler, a listen address that cannot be bound, an ``[output] dir`` that cannot be
    written, missing language data or model folder. The roots were made and checked before
    (``roots.prepare``)."""
    needs = itertools.chain(
        _poppler(cfg), _listens(cfg), _engine(cfg, probe=False), _folders(cfg, prepare=True)
    )
    failed = [result for result in needs if not result.ok]
    if failed:
        where = f"{cfg.source_file}: " if cfg.source_file else ""
        raise ConfigError(
            "\n".join(f"{where}{result.what}: {result.detail}" for result in failed),
            hint="; ".join(dict.fromkeys(result.hint or ConfigError.hint for result in failed)),
        )


def require_engine(cfg: Config) -> None:
    """Raise ``ConfigError`` when the engine chosen cannot start here (vLLM not installed, its
    model folder missing, no Tesseract binary), naming what chose it: what ``ocrwatch ocr`` asks
    before it builds an engine of its own, as ``preflight`` does before a start. Languages are
    ``require_languages``'s."""
    spec = registry.find(registry.choose(cfg.engine)[0])
    _raise_first(spec.checks(cfg, False, []), None)


def require_languages(cfg: Config, lang: str | None = None, *, kind: str | None = None) -> None:
    """Raise ``ConfigError`` when the engine (``kind``, else the configured one) cannot read a
    configured language (a reload adding an inbox whose ``lang`` is not installed is refused);
    with ``lang`` (``ocrwatch ocr --lang``), that one instead."""
    spec = registry.find(kind or registry.choose(cfg.engine)[0])
    wanted = None if lang is None else [("--lang", lang)]
    if spec.languages is not None:
        _raise_first(spec.checks(cfg, False, wanted), None if lang else cfg.source_file)


def _raise_first(results: Iterator[Check], source_file: Path | None) -> None:
    for result in results:
        if not result.ok:
            where = f"{source_file}: " if source_file else ""
            raise ConfigError(
                f"{where}{result.what}: {result.detail}", hint=result.hint or ConfigError.hint
            )


# --- programs -------------------------------------------------------------------------------------


def _poppler(cfg: Config) -> Iterator[Check]:
    """pdfinfo probes every PDF; pdftoppm renders them unless ``[render] renderer = "pdfium"``."""
    tools = ("pdfinfo", "pdftoppm") if cfg.render.renderer == "pdftoppm" else ("pdfinfo",)
    for tool in tools:
        path = shutil.which(tool)
        if path is None:
            yield Check(
                False,
                tool,
                "not found on PATH",
                "install poppler-utils (apt-get install poppler-utils)",
            )
            continue
        said = command_output([path, "-v"])
        version = re.search(r"version\s+(\S+)", said or "")
        yield Check(True, tool, f"{version.group(1) if version else '(version unknown)'} at {path}")
    if cfg.render.renderer == "pdftoppm":  # each pdftoppm runs under it, within its memory limit
        path = shutil.which(children.PRLIMIT)
        if path is None:
            yield Check(False, "prlimit", "not found on PATH", "install util-linux")
        else:
            yield Check(True, "prlimit", f"at {path}: bounds the memory of each pdftoppm")
    if cfg.render.renderer == "pdfium":
        if importlib.util.find_spec("pypdfium2") is None:
            yield Check(
                False,
                "[render] renderer pdfium",
                "pypdfium2 is not installed",
                "pip install 'ocrwatch[pdfium]', or remove the key",
            )
        else:
            yield Check(True, "[render] renderer pdfium", "pypdfium2 is installed")


# --- the engine -----------------------------------------------------------------------------------


def _engine(cfg: Config, *, probe: bool) -> Iterator[Check]:
    """The engine's own checks (its spec's); with ``probe``, also what only matters to
    ``check``, and the engine tried as its spec says (a Tesseract page recognised, a plugin
    built)."""
    try:
        kind, reason = registry.choose(cfg.engine, registry.chosen_by(cfg))
        spec = registry.find(kind)
    except OcrwatchError as exc:
        yield Check(False, "[engine] kind", exc.message, exc.hint)
        return
    if probe:
        yield Check(True, "engine", f"{kind}: {reason}")
    results = list(spec.checks(cfg, probe, None))
    yield from results
    if probe and spec.trial != "none" and all(result.ok for result in results):
        yield _started(cfg, kind, start=spec.trial == "start")


def _started(cfg: Config, kind: str, *, start: bool = True) -> Check:
    """The engine built (and started and closed again: a Tesseract page recognised)."""
    try:
        engine = registry.build(cfg.engine, cfg.output.images, kind=kind)
        if start:
            with _quiet():
                asyncio.run(_start_and_close(engine))
    except OcrwatchError as exc:
        return Check(False, f"engine {kind}", exc.message, exc.hint)
    return Check(True, f"engine {kind}", "recognised a test page" if start else "was built")


async def _start_and_close(engine: Any) -> None:
    await engine.start()
    await engine.close()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Log lines below warnings silenced: the engine's own (``tesseract.started``) would follow the
    table on stderr, and its line in the table says what they would."""
    wrapper = structlog.get_config()["wrapper_class"]
    level = getattr(wrapper, "get_effective_level", lambda self: 0)(None)
    quiet = structlog.make_filtering_bound_logger(max(level, logging.WARNING))
    structlog.configure(wrapper_class=quiet)
    try:
        yield
    finally:
        structlog.configure(wrapper_class=wrapper)


# --- folders and addresses ------------------------------------------------------------------------


def _files(found: Sequence[roots.Root], problems: Problems) -> Iterator[Check]:
    """The configuration file and each file a secret is read from: a ``FAIL`` line for each breach
    of the trust rule (``roots``) and for secrets that others may read, an ``ok`` line for each
    secret file that passes."""
    exposed = roots.exposed(found)
    for root in found:
        if root.kind != "file":
            continue
        failed = [*problems.get(root.key, []), *(p for p in exposed if p.root == root)]
        yield from (_failed(problem) for problem in failed)
        if not failed and root.key != "config":
            owners = "root" if _user() == "root" else f"{_user()} or root"
            said = f"is private: no one but {owners} may write or read it"
            yield Check(True, f"{root.key} {root.path}", said)


def _failed(problem: roots.Problem) -> Check:
    return Check(False, f"{problem.root.key} {problem.root.path}", problem.text, problem.fix)


Problems = dict[str, list[roots.Problem]]
"""What the trust rule finds (``roots.check``), by the key of the root it is about."""


def _folders(cfg: Config, *, prepare: bool, problems: Problems | None = None) -> Iterator[Check]:
    """Inboxes readable (and writable where sidecars go beside the documents), the quarantine,
    ``[output] dir`` and state_dir writable; a root that breaks the trust rule (``problems``) gets
    its ``FAIL`` lines instead. With ``prepare``, only what stops a start: ``[output] dir``
    written."""
    user = _user()
    out = cfg.output.dir
    if prepare:
        if out is not None and (why := _written(out)) is not None:
            what = f"{cfg.key(('output', 'dir'))} {out}"
            yield Check(False, what, f"cannot be written: {why}", _FOLDER_HINT.format(out, user))
        return
    problems = problems or {}
    keyed = {root.key: root for root in cfg.roots()}

    def judged(loc: Loc, probe: Callable[[str], Check]) -> Iterator[Check]:
        """The root at ``loc``: its trust rule's ``FAIL`` lines, else what ``probe`` finds."""
        key = cfg.key(loc)
        said = problems.get(key)
        yield from (_failed(problem) for problem in said) if said else (probe(key),)

    for index, inbox in enumerate(cfg.inbox):
        moves = (
            inbox.quarantine_dir is not None
            or (inbox.on_success or cfg.output.on_success) != "keep"
        )
        note = "(documents are moved out of it)" if moves else ""
        if out is None:
            note, moves = "(sidecars are written beside the documents)", True
        yield from judged(
            ("inbox", index, "path"), functools.partial(_inbox, inbox, user, note, moves)
        )
        if inbox.quarantine_dir is not None:
            loc: Loc = ("inbox", index, "quarantine_dir")
            yield from judged(loc, functools.partial(_folder, keyed, user))
    for key in ("archive_dir", "dir"):
        if getattr(cfg.output, key) is not None:
            yield from judged(("output", key), functools.partial(_folder, keyed, user))
    yield from judged(("state_dir",), functools.partial(_folder, keyed, user))


def _inbox(inbox: InboxConfig, user: str, note: str, write: bool, key: str) -> Check:
    """``check``'s line on an inbox folder: there (or made at start), readable, and writable where
    ocrwatch writes or moves there."""
    what = f"{key} {inbox.path}"
    if not inbox.path.exists() and not inbox.create:
        return Check(
            False, what, "does not exist (create = false)", f"create it, readable by {user}"
        )
    return _place(what, inbox.path, user, note, write=write)


def _folder(keyed: dict[str, roots.Root], user: str, key: str) -> Check:
    """``check``'s line on a folder ocrwatch writes: writable, or creatable where it is missing."""
    path = keyed[key].path
    return _place(f"{key} {path}", path, user, "")


_FOLDER_HINT = (
    "create {0} and give {1} (the user ocrwatch runs as) write access to it, or correct the path"
)
_USER_FAULTS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOTDIR,
        errno.EEXIST,
        errno.ELOOP,
        errno.ENAMETOOLONG,
    }
)
"""What a folder that cannot be made or written at start is, when the user must fix it; anything
else (EIO, a stale NFS handle) may pass, and is left to the source's and the sink's retries."""


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry for this uid (a container): the number says it
        return f"uid {os.getuid()}"


def _written(folder: Path) -> str | None:
    """``preflight``'s probe of a folder made at start (``roots.prepare``): a file made and removed
    in it; why not, when the user must act."""
    try:
        handle, name = tempfile.mkstemp(prefix=".ocrwatch-check-", dir=folder)
        os.close(handle)
        os.unlink(name)
    except OSError as exc:
        return (exc.strerror or str(exc)).lower() if exc.errno in _USER_FAULTS else None
    return None


def _place(what: str, folder: Path, user: str, note: str, *, write: bool = True) -> Check:
    """``check``'s verdict on a folder, without creating it."""
    if folder.exists():
        why = _probe(folder, write=write)
        done = f"is {'writable' if write else 'readable'} by {user}"
    else:
        why, done = _creatable(folder), f"does not exist yet; {user} can create it"
    if why is not None:
        return Check(
            False,
            what,
            why,
            _FOLDER_HINT.format(folder, user) if write else f"make it readable by {user}",
        )
    return Check(True, what, f"{done} {note}".rstrip())


def _probe(folder: Path, *, write: bool) -> str | None:
    """None when ``folder`` is a folder that can be listed (and in which a file can be made and
    removed, with ``write``); else why not."""
    try:
        os.listdir(folder)
        if write:
            handle, name = tempfile.mkstemp(prefix=".ocrwatch-check-", dir=folder)
            os.close(handle)
            os.unlink(name)
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    return None


def _creatable(folder: Path) -> str | None:
    """None when this user can make a file in the nearest existing folder above ``folder`` (so
    ``folder`` can be created there); else why not."""
    above = folder.absolute()
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"cannot be created: {above} is not a folder"
    why = _probe(above, write=True)
    return None if why is None else f"cannot be created in {above}: {why}"


Holder = Callable[[], tuple[int, list[str]] | str | None]
"""The daemon holding state_dir, asked: its pid and the addresses it listens on; None when none
holds it; or why it could not be asked."""


def _listens(cfg: Config, holder: Holder | None = None) -> Iterator[Check]:
    """The metrics endpoint and each S3 webhook can bind their addresses; with ``holder``
    (``check``), one in use by the daemon holding state_dir is its own (``preflight`` runs in that
    daemon: none)."""
    for key, listen in control.listeners(cfg).items():
        yield _listen(key, listen, holder)


def _daemon_listening(state_dir: Path) -> tuple[int, list[str]] | str | None:
    """``Holder``'s answer, asked of the control socket (blocking: at most
    ``control.CONNECT_SECONDS``)."""
    try:
        client = control.Client.connect(state_dir)
        if client is None:
            return None
        events = list(client.request({"op": "status"}))
        daemon = next(event["daemon"] for event in events if event.get("event") == "status")
        listening = daemon.get("listening", {})
        return int(daemon["pid"]), [str(address) for address in listening.values()]
    except OcrwatchError as exc:
        return exc.message
    except (StopIteration, KeyError, TypeError, ValueError, AttributeError):
        return "its status answer names no pid and no listeners"


def _resolved(listen: str) -> set[Any]:
    """Every socket address ``listen`` binds; none when it is no HOST:PORT of this host."""
    try:
        host, port = host_port(listen)
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (ValueError, OSError):
        return set()
    return {address for *_, address in found}


def _held(what: str, listen: str, holder: Holder) -> Check | None:
    """An address in use, when the daemon holding state_dir says it listens there: its own."""
    answer = holder()
    if isinstance(answer, tuple) and any(_resolved(listen) & _resolved(one) for one in answer[1]):
        return Check(True, what, f"is held by the running daemon (pid {answer[0]})")
    if isinstance(answer, str):
        detail = "address already in use; the daemon holding state_dir could not be asked whether"
        hint = "run check as the user the daemon runs as"
        return Check(False, what, f"{detail} it is its own: {answer}", hint)
    return None


def _listen(key: str, listen: str, holder: Holder | None = None) -> Check:
    """Bind ``listen`` as the listener will (SO_REUSEADDR, every address the host resolves to), then
    let go."""
    what = f"{key} {listen}"
    hint = f"stop what listens there (another ocrwatch?), or set {key} to a free HOST:PORT"
    try:
        host, port = host_port(listen)
    except ValueError as exc:
        return Check(False, what, str(exc), f"set {key} to HOST:PORT, e.g. 127.0.0.1:9464")
    if port > 65535:
        return Check(
            False, what, f"port {port} is out of range", f"set {key} to a port from 1 to 65535"
        )
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return Check(
            False,
            what,
            f"cannot resolve the host: {exc.strerror}",
            f"set {key} to an address of this host",
        )
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                in_use = exc.errno == errno.EADDRINUSE
                held = _held(what, listen, holder) if in_use and holder else None
                return held or Check(False, what, (exc.strerror or str(exc)).lower(), hint)
    return Check(True, what, "is free")


# --- S3 -------------------------------------------------------------------------------------------


def _s3(index: int, cfg: S3Config) -> Iterator[Check]:
    """Credentials, the endpoint (always, bucket or not), the queue and each bucket: one line per
    probe."""
    import boto3  # only where a bucket is configured: boto3 costs start-up time
    import botocore.exceptions

    from ocrwatch.infra import s3client

    name = f"s3[{index}]"
    session = boto3.session.Session(
        aws_access_key_id=cfg.access_key_id,
        aws_secret_access_key=cfg.secret_access_key,
        region_name=cfg.region,
    )
    if session.get_credentials() is None:
        yield Check(
            False,
            f"{name} credentials",
            "none found",
            "set access_key_id and secret_access_key, or provide them through the AWS standard "
            "chain",
        )
        return
    try:
        s3 = s3client.new_client(cfg, "s3", read_timeout=10.0)
        sqs = s3client.new_client(cfg, "sqs", read_timeout=10.0) if cfg.transport == "sqs" else None
    except botocore.exceptions.BotoCoreError as exc:
        yield Check(False, f"{name} client", str(exc), "check endpoint_url and region")
        return
    endpoint = f"{name} endpoint {cfg.endpoint_url or 'AWS'}"
    credentials = (
        "check access_key_id and secret_access_key (or the credentials of the AWS standard chain)"
    )
    reachable = True
    try:
        buckets = s3.list_buckets().get("Buckets", [])
    except botocore.exceptions.ClientError as exc:
        if s3client.error_code(exc) in ("AccessDenied", "Forbidden"):
            yield Check(
                True,
                endpoint,
                "answered; credentials accepted (listing buckets is not allowed to them)",
            )
        else:
            yield Check(False, endpoint, _said(exc), credentials)
    except Exception as exc:
        reachable = False
        yield Check(
            False,
            endpoint,
            f"cannot be reached: {exc}",
            "start the server, or correct endpoint_url",
        )
    else:
        yield Check(
            True, endpoint, f"answered; credentials accepted ({len(buckets)} bucket(s) visible)"
        )
    if sqs is not None:
        what = f"{name} queue {cfg.queue_url}"
        try:
            attributes = sqs.get_queue_attributes(QueueUrl=cfg.queue_url, AttributeNames=["All"])[
                "Attributes"
            ]
        except Exception as exc:
            yield Check(
                False,
                what,
                _said(exc),
                "create the queue, or correct queue_url and the credentials",
            )
        else:
            if cfg.on_max_receives == "dead_letter" and "RedrivePolicy" not in attributes:
                yield Check(
                    False,
                    what,
                    "has no RedrivePolicy, but on_max_receives = 'dead_letter'",
                    "give the queue a dead-letter queue, or set on_max_receives = 'error_sidecar'",
                )
            else:
                yield Check(True, what, "answered")
    if cfg.transport == "amqp":  # the broker and the queue, through the daemon's own client
        from ocrwatch.sources.amqp import probe

        yield from (Check(*found) for found in probe(cfg, index))
    for bucket in dict.fromkeys(b for b in (cfg.bucket, cfg.output_bucket) if b and reachable):
        try:
            s3.head_bucket(Bucket=bucket)
        except Exception as exc:
            yield Check(
                False,
                f"{name} bucket {bucket}",
                _said(exc),
                "create the bucket, or correct its name",
            )
        else:
            yield Check(True, f"{name} bucket {bucket}", "answered")


def _said(exc: BaseException) -> str:
    """What S3 said (its code and message), never a credential."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        return f"{error.get('Code') or 'error'} ({error.get('Message') or 'no message'})"
    return f"{type(exc).__name__}: {exc}"
