"""structlog set-up: JSON lines when not on a terminal (systemd, pipes), key=value on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from ocrwatch.config import LogConfig


def use_json(cfg: LogConfig, stream: TextIO) -> bool:
    if cfg.format == "auto":
        return not stream.isatty()
    return cfg.format == "json"


def configure(cfg: LogConfig, stream: TextIO = sys.stderr) -> None:
    """Configure once at start-up; every module then logs through ``structlog.get_logger()``."""
    level = getattr(logging, cfg.level.upper())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(ensure_ascii=False)
        if use_json(cfg, stream)
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
