"""What the AMQP transport decides without a broker: where its URL comes from, how it is shown, and
how many times a message has been delivered.

Kept apart from ``sources.amqp`` so these rules are tested without aio-pika and a broker, and so
``ocrwatch check`` reads the URL exactly as the daemon does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ocrwatch.config import S3Config
from ocrwatch.errors import ConfigError

SCHEMES = ("amqp", "amqps")


def broker_url(cfg: S3Config, index: int) -> str:
    """The broker's URL from ``url`` (which ``OCRWATCH_S3_0_URL`` sets from the environment, for
    the first table) or the file ``url_file`` holds (its first line): a password stays out of the
    configuration file either way. Raises ``ConfigError`` naming the key, never the URL."""
    key = f"s3[{index}]"
    if cfg.url is not None:
        url, where = cfg.url, f"{key}.url"
    else:
        assert cfg.url_file is not None
        where = f"{key}.url_file"
        try:
            text = cfg.url_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = (
                exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            )
            raise ConfigError(f"{where}: {cfg.url_file} cannot be read: {reason}") from None
        url = (text.strip().splitlines() or [""])[0].strip()
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ConfigError(f"{where}: not an amqp:// or amqps:// URL with a host ({redacted(url)})")
    return url


def redacted(url: str) -> str:
    """The URL as logs show it: the user name kept, the password never."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is no number: show nothing of what follows the scheme
        return f"{url.partition(':')[0]}://?"
    user = f"{parts.username}@" if parts.username else ""
    host = f"[{host}]" if ":" in host else host
    return urlunsplit((parts.scheme, f"{user}{host}{port}", parts.path, "", ""))


def receives(headers: Mapping[str, Any] | None, redelivered: bool, queue: str) -> int:
    """How many times this message has been delivered, this delivery included.

    A quorum queue counts earlier deliveries in ``x-delivery-count``; a message dead-lettered from
    ``queue`` and routed back to it (a retry loop through a dead-letter exchange) carries the count
    in ``x-death``; a classic queue says only ``redelivered``, hence at least 2. The largest wins.
    """
    headers = headers or {}
    seen = 2 if redelivered else 1
    count = headers.get("x-delivery-count")
    if type(count) is int and count >= 0:
        seen = max(seen, count + 1)
    deaths = headers.get("x-death")
    if isinstance(deaths, list | tuple):
        died = 0
        for death in deaths:
            if not isinstance(death, Mapping) or _text(death.get("queue")) != queue:
                continue
            if _text(death.get("reason")) in ("rejected", "expired", "delivery_limit"):
                number = death.get("count")
                died += number if type(number) is int and number > 0 else 1
        seen = max(seen, died + 1)
    return seen


def _text(value: Any) -> str | None:
    """A header's string, which the AMQP codec may hand over as bytes."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None
