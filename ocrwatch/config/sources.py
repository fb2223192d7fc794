"""The array-of-tables sections (``[[inbox]]``, ``[[s3]]``, ``[[hook]]``): what feeds documents in
and what is told when they are done, each key declared once with its default and description."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from ocrwatch.config.base import (
    DEFAULT_PRIORITY,
    Auto,
    Duplicates,
    Formats,
    KeyProblem,
    Lang,
    MiB,
    Model,
    NonEmptyPath,
    OnSuccess,
    TextMode,
)

PRIORITY = "0..100; a higher lane always goes first."
PROMPT = "Prompt preset: markdown, free, figure, or a name from [engine.vllm] prompts."
ON_SUCCESS = "What becomes of a source once its document is ok; unset = [output] on_success."
FORMATS = "The files written for each of its documents; unset = [output] formats."


class InboxConfig(Model):
    path: NonEmptyPath = Field(Path("inbox"), description="The folder watched.")
    recursive: bool = Field(True, description="Watch subfolders too.")
    # watchdog's poller recurses a level each, hence the bound.
    max_depth: Annotated[int, Field(ge=1, le=256)] = Field(
        32,
        description=(
            "Levels of subfolders watched and scanned (1..256); a deeper folder is refused with "
            "one log line and its documents are not taken."
        ),
    )
    patterns: tuple[str, ...] = Field(
        ("*.pdf", "*.png", "*.jpg", "*.jpeg", "*.tif", "*.tiff", "*.webp"),
        description=("File names taken (case-insensitive); the type is still decided by content."),
    )
    priority: Annotated[int, Field(ge=0, le=100)] = Field(DEFAULT_PRIORITY, description=PRIORITY)
    prompt: str = Field("markdown", description=PROMPT)
    polling: Literal["auto"] | bool = Field(
        "auto",
        description=(
            '"auto" = polling on NFS/SMB/FUSE mounts (no inotify there), native events elsewhere; '
            "or"
            " true / false."
        ),
    )
    poll_seconds: Annotated[float, Field(ge=0.1, le=3600)] = Field(
        1.0,
        description=(
            "Seconds between two looks of a polled inbox (0.1..3600); a look lists every folder, "
            "so a big inbox on a file server may want more. Native events do not poll, but for "
            "the folders beyond max_watches."
        ),
    )
    max_watches: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        8192,
        description=(
            "Folders of this inbox watched through inotify at most (1..1,000,000), each a watch "
            "from the daemon user's kernel budget (fs.inotify.max_user_watches); folders beyond "
            "them are scanned every poll_seconds instead, and one log line says so."
        ),
    )
    ignore: tuple[Annotated[str, Field(pattern=r"^[^/\x00]+/?$")], ...] = Field(
        (),
        description=(
            "Names never taken, on top of the built-ins (hidden names; .DS_Store, ._*, Thumbs.db, "
            "desktop.ini, @eaDir/, .stfolder/, __MACOSX/, *.part, *.crdownload, *.tmp, ~$*). Globs "
            "(*, ?, [...]) matched case-insensitively against one file or folder name, never a "
            "path; a trailing / names a folder, neither watched nor scanned, nor anything below "
            "it. `ocrwatch ocr DIR` inside this inbox skips the same names."
        ),
    )
    settle_seconds: Annotated[float, Field(ge=0, le=3600)] = Field(
        2.0,
        description=(
            "A file is taken once its size and mtime have not changed for this long (or on"
            " close-after-write)."
        ),
    )
    max_bytes: Annotated[int, Field(ge=1)] | None = Field(
        None,
        examples=[104857600],
        description=("This inbox's [limits] max_bytes; unset = [limits]'s."),
    )
    max_pages: Annotated[int, Field(ge=1)] | None = Field(
        None, examples=[500], description=("This inbox's [limits] max_pages; unset = [limits]'s.")
    )
    quarantine_dir: NonEmptyPath | None = Field(
        None,
        examples=["quarantine"],
        description=(
            "Move sources that fail for their own bytes here (empty, not a document, encrypted,"
            " corrupt, no pages); one failed for a fault beside it (a file at a sidecar's name, a"
            " limit, a setting) stays for its hint's fix and `ocrwatch retry` (unset: every failure"
            " stays where it is, with an .error.json)."
        ),
    )
    create: bool = Field(
        True,
        description=(
            "Create the inbox folder if it does not exist (at start; a folder that cannot be "
            "created stops the start)."
        ),
    )
    lang: Lang | None = Field(
        None,
        examples=["deu+eng"],
        description=(
            'Tesseract language packs for this inbox, e.g. "deu+eng" (install tesseract-ocr-deu);'
            ' unset = [engine.tesseract] lang; "auto": each page in the installed language of the'
            " script orientation detection finds on it. Checked at start (and at reload): missing"
            " data stops it."
            " The vllm engine reads every language itself: for it the key only names the word "
            "lists a"
            ' PDF\'s text layer is judged by (text = "auto").'
        ),
    )
    on_success: OnSuccess | None = Field(None, examples=["move"], description=ON_SUCCESS)
    formats: Formats | None = Field(
        None, examples=[["md", "json", "alto", "hocr"]], description=FORMATS
    )
    duplicates: Duplicates = Field(
        "reuse",
        description=(
            "A file with the very bytes of one this inbox already did, for the same user, takes "
            "that"
            ' result ("reuse": its sidecars copied, "reused_from" in the JSON naming the earlier'
            ' file, its hooks run; no OCR), or is read again ("ocr"). Reuse needs the earlier'
            " sidecars unchanged, read with this inbox's engine, lang, prompt and rendering, and no"
            " searchable PDF or figures."
        ),
    )
    text: TextMode | None = Field(
        None,
        examples=["auto"],
        description=(
            'Where a PDF page\'s text comes from: "ocr" (the engine reads the rendered page),'
            ' "auto" (the page\'s own text layer where it passes the check: readable codes, letters'
            " an installed Tesseract language has, 70 % of its words in lang's word lists; the "
            "engine"
            ' reads the rest) or "layer" (the layer wherever the page has text). A page taken from'
            " its layer is neither rendered nor read by the engine, and its searchable PDF page "
            "keeps"
            ' its own text. Unset = the engine\'s default: "auto" for tesseract, "ocr" for vllm'
            " (its Markdown keeps the tables and headings a text layer lacks). Images are always"
            " OCR'd."
        ),
    )


SQS, HOOK, AMQP = "sqs: ", "webhook: ", "amqp: "


def _secret_file(key: str, before: str = "") -> str:
    """The description of the key that names a file ``key``'s secret is read from."""
    said = (
        f"instead of {key}: read it from this file's first line at start (an absolute path; owned"
        " by root or the user ocrwatch runs as, writable by no one else), so the configuration"
        " holds no secret; under systemd a LoadCredential= file (systemd/ocrwatch.service shows"
        " how)."
    )
    return before + said if before else said[0].upper() + said[1:]


class S3Config(Model):
    transport: Literal["sqs", "webhook", "amqp"] = Field(
        "sqs",
        description=(
            'How S3 events arrive: "sqs" (S3 event notifications delivered to an SQS queue, AWS),'
            ' "webhook" (Ceph RGW / MinIO push S3 events over HTTP to ocrwatch) or "amqp" (Ceph'
            " RGW / MinIO publish S3 events to RabbitMQ; any number of hosts consume one queue; "
            "needs"
            " the extra: pip install 'ocrwatch[amqp]')."
        ),
    )
    queue_url: str | None = Field(
        None,
        examples=["https://sqs.eu-west-1.amazonaws.com/123456789012/ocr-events"],
        description=SQS + 'the queue; required with transport "sqs".',
    )
    url: str | None = Field(  # may carry a password, so never shown
        None,
        repr=False,
        examples=["amqps://ocrwatch:secret@mq.example.internal/ocr"],
        description=AMQP + "the broker; url or url_file (or the environment: OCRWATCH_S3_0_URL).",
    )
    url_file: NonEmptyPath | None = Field(
        None,
        examples=["/etc/ocrwatch/amqp-url"],
        description=(AMQP + "the URL from this file's first line (an absolute path)."),
    )
    queue: str | None = Field(
        None,
        examples=["ocr-events"],
        description=(AMQP + "the queue consumed; declared if absent (durable, quorum)."),
    )
    exchange: str = Field(
        "",
        description=(
            AMQP
            + 'bound to the queue; declared if absent (topic); "" = no binding (the queue is fed'
            " otherwise)."
        ),
    )
    routing_key: str = Field(
        "#", description=(AMQP + "of that binding (RGW routes by its topic's name).")
    )
    dead_letter_exchange: str = Field(
        "", description=(AMQP + "x-dead-letter-exchange, when ocrwatch declares the queue.")
    )
    prefetch: Annotated[int, Field(ge=1, le=65535)] | Auto = Field(
        "auto",
        description=(
            AMQP + 'messages held unacknowledged at once; "auto" = [scheduler]'
            " max_active_documents."
        ),
    )
    endpoint_url: str | None = Field(
        None,
        examples=["https://s3.example.internal"],
        description=("S3-compatible servers' endpoint; unset for AWS."),
    )
    region: str | None = Field(None, examples=["eu-west-1"], description="The S3 (and SQS) region.")
    bucket: str | None = Field(
        None, examples=["scans"], description=("Only events of this bucket (unset = any).")
    )
    prefix: str = Field("", description="Only keys under this prefix.")
    suffixes: tuple[str, ...] = Field(
        (".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp"),
        description=("Key endings taken (case-insensitive); the type is still decided by content."),
    )
    output_bucket: str | None = Field(
        None,
        examples=["scans-ocr"],
        description=("The bucket sidecars are written to; unset = beside the key."),
    )
    output_prefix: str = Field("", description="Put before each sidecar's key.")
    listen: str = Field("127.0.0.1:8787", description=HOOK + "bind address.")
    path: str = Field("/s3/events", description=HOOK + "URL path.")
    token: str | None = Field(
        None,
        repr=False,
        examples=["a-long-random-secret"],
        description=(HOOK + "the shared secret; token or token_file is required."),
    )
    token_file: NonEmptyPath | None = Field(
        None,
        examples=["/etc/ocrwatch/webhook-token"],
        description=_secret_file("token", HOOK),
    )
    max_body_bytes: Annotated[int, Field(ge=1024)] = Field(
        1 * MiB, description=(HOOK + "larger bodies get 413.")
    )
    visibility_timeout_seconds: Annotated[int, Field(ge=10, le=43200)] = Field(
        300,
        description=(
            SQS + "a message's visibility timeout, extended by a heartbeat while processing."
        ),
    )
    wait_time_seconds: Annotated[int, Field(ge=0, le=20)] = Field(
        20, description=(SQS + "long polling.")
    )
    receive_backoff_max_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        30.0,
        description=(
            SQS
            + "while the queue cannot be reached, receiving is retried for ever, with exponential"
            " backoff (and a second of jitter) of at most this long."
        ),
    )
    max_receives: Annotated[int, Field(ge=1)] = Field(
        5,
        description=(
            "sqs, amqp: deliveries of one message before the error sidecar, or the dead-letter "
            "queue (amqp: dead-lettered, after the error sidecar)."
        ),
    )
    on_max_receives: Literal["error_sidecar", "dead_letter"] = Field(
        "error_sidecar",
        description=('What max_receives leads to: "error_sidecar" or "dead_letter".'),
    )
    priority: Annotated[int, Field(ge=0, le=100)] = Field(DEFAULT_PRIORITY, description=PRIORITY)
    prompt: str = Field("markdown", description=PROMPT)
    access_key_id: str | None = Field(
        None, examples=["..."], description=("Unset = the standard AWS credential chain.")
    )
    secret_access_key: str | None = Field(
        None,
        repr=False,
        examples=["..."],
        description=("The secret of access_key_id; or secret_access_key_file."),
    )
    secret_access_key_file: NonEmptyPath | None = Field(
        None,
        examples=["/etc/ocrwatch/s3-secret"],
        description=_secret_file("secret_access_key"),
    )
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto",
        description=('botocore\'s bucket addressing; "path" for most S3-compatible servers.'),
    )
    on_success: OnSuccess | None = Field(
        None,
        examples=["keep"],
        description=(
            ON_SUCCESS + ' "delete" deletes the version read; "move" copies it to archive_prefix +'
            " key, then deletes it."
        ),
    )
    formats: Formats | None = Field(
        None, examples=[["md", "json", "alto", "hocr"]], description=FORMATS
    )
    archive_prefix: str = Field(
        "",
        description=(
            'Where "move" puts keys; required with "move"; keys under it are never documents.'
        ),
    )
    duplicates: Duplicates = Field(
        "reuse",
        description=(
            'An object with the ETag and size of one done in this bucket takes its result; "ocr"'
            " reads it again."
        ),
    )

    @model_validator(mode="after")
    def _transport_needs(self) -> S3Config:
        _secret_once(self, "secret_access_key")
        _secret_once(self, "token")
        if self.transport == "sqs" and not self.queue_url:
            raise KeyProblem(("queue_url",), "required with transport 'sqs'")
        if self.transport == "webhook" and not (self.token or self.token_file):
            said = "required with transport 'webhook': a shared secret (or token_file)"
            raise KeyProblem(("token",), said)
        if self.transport == "amqp":
            if (self.url is None) == (self.url_file is None):
                raise KeyProblem(("url",), "transport 'amqp' needs exactly one of url and url_file")
            if not self.queue:
                raise KeyProblem(("queue",), "required with transport 'amqp'")
            if self.url_file is not None and not self.url_file.is_absolute():
                said = "an absolute path (the working folder is no anchor)"
                raise KeyProblem(("url_file",), said)
            if importlib.util.find_spec("aio_pika") is None:
                raise KeyProblem(
                    ("transport",),
                    "'amqp' needs aio-pika, which is not installed: pip install 'ocrwatch[amqp]'",
                )
        return self


HookStatus = Literal["ok", "partial", "failed"]


class HookConfig(Model):
    """One ``[[hook]]``: a program run, or a URL posted to, once a document's final status is
    known."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")] = Field(
        examples=["post.sh"],
        description=(
            "Keys its deliveries and metrics; default: the program's file name, or the URL's"
            " host:port. Keep it when editing the hook."
        ),
    )
    on: tuple[HookStatus, ...] = Field(
        ("ok", "partial", "failed"), description=("The statuses it runs for.")
    )
    command: tuple[str, ...] | None = Field(
        None,
        examples=[["/usr/local/bin/ocr-done", "--to", "/srv/archive"]],
        description=(
            "argv, never a shell; the JSON on stdin; the environment has OCRWATCH_STATUS,"
            " OCRWATCH_SOURCE (file:// or s3:// URI where the source is now: archived,"
            " quarantined, or empty once deleted), OCRWATCH_ORIGINAL (where it was dropped),"
            " OCRWATCH_JSON and OCRWATCH_MD (sidecar paths or s3:// URIs; for failed: the"
            ' .error.json, and OCRWATCH_MD empty). A zero exit delivers it. A path with a "/"'
            " is relative to this file; a bare name is looked up on PATH."
        ),
    )
    url: str | None = Field(
        None,
        examples=["https://chat.example.com/hooks/ocr"],
        description=(
            "Instead of command: the JSON POSTed as application/json, with Ocrwatch-Status, "
            "Ocrwatch-Source, Ocrwatch-Original headers; a 2xx delivers it; redirects are not "
            "followed."
        ),
    )
    token: str | None = Field(
        None,
        repr=False,
        examples=["a-long-random-secret"],
        description=('url only: sent as "Authorization: Bearer <token>".'),
    )
    token_file: NonEmptyPath | None = Field(
        None,
        examples=["/etc/ocrwatch/hook-token"],
        description=_secret_file("token", "url only: "),
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=86400)] = Field(
        60.0, description=("Per attempt; a command's whole process group is killed then.")
    )
    max_attempts: Annotated[int, Field(ge=1, le=100)] = Field(
        5,
        description=(
            "Attempts (a non-zero exit, a non-2xx answer, no connection), then hook_failed; "
            "counted in the ledger across restarts."
        ),
    )
    backoff_initial_seconds: Annotated[float, Field(ge=0, le=3600)] = Field(
        2.0, description=("Exponential backoff with jitter between attempts: the first wait.")
    )
    backoff_max_seconds: Annotated[float, Field(ge=0, le=86400)] = Field(
        300.0, description=("The longest wait between two attempts.")
    )
    concurrency: Annotated[int, Field(ge=1, le=64)] = Field(
        4, description=("Deliveries of this hook running at once.")
    )

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        """A hook's name keys its deliveries in the ledger and its metrics: by default the
        program's file name or the URL's host, so reordering the hooks never hands one hook's
        pending deliveries to another."""
        if not isinstance(data, dict):
            return data
        # Validation after a "before" validator reads Python, not JSON, whose strict mode takes no
        # list for a tuple: TOML's arrays become the tuples they stand for.
        data = {key: tuple(val) if isinstance(val, list) else val for key, val in data.items()}
        if "name" not in data:
            command, url, name = data.get("command"), data.get("url"), ""
            if isinstance(command, tuple) and command and isinstance(command[0], str):
                name = Path(command[0]).name
            elif isinstance(url, str):
                name = urlsplit(url).netloc.rpartition("@")[2]
            data = {**data, "name": name or "hook"}  # "hook": the checks below say what is missing
        return data

    @model_validator(mode="after")
    def _one_target(self) -> HookConfig:
        if (self.command is None) == (self.url is None):
            raise KeyProblem(("command",), "give exactly one of command (argv) and url")
        if not self.on or len(set(self.on)) != len(self.on):
            raise KeyProblem(("on",), "name each of ok, partial, failed at most once, at least one")
        if self.command is not None:
            if not self.command or not self.command[0] or any("\0" in arg for arg in self.command):
                raise KeyProblem(("command",), "a non-empty argv list, the program first")
            if shutil.which(self.command[0]) is None:
                raise KeyProblem(
                    ("command",), f"{self.command[0]!r} is not an executable file (nor one on PATH)"
                )
            for key in ("token", "token_file"):
                if getattr(self, key) is not None:
                    said = "only for a url hook (sent as Authorization: Bearer)"
                    raise KeyProblem((key,), said)
        _secret_once(self, "token")
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise KeyProblem(("url",), "an http:// or https:// URL with a host")
        return self


def _secret_once(config: Model, key: str) -> None:
    """A secret given once: inline (``key``) or from a file (``key_file``, an absolute path, since
    the working folder is no anchor for a file read at every start), not both."""
    path = getattr(config, f"{key}_file")
    if path is None:
        return
    if getattr(config, key) is not None:
        raise KeyProblem((f"{key}_file",), f"give {key} or {key}_file, not both")
    if not path.is_absolute():
        raise KeyProblem((f"{key}_file",), "an absolute path (the working folder is no anchor)")
