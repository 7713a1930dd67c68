"""structlog set-up, done once per process.

Library modules only call ``structlog.get_logger()``; the program entry point (the CLI, a test
harness or an embedding service) decides how records render.  People read a console, machines
read JSON, so the choice follows whether stderr is a terminal.
"""

from __future__ import annotations

import logging
import sys

import structlog

_configured = False


def configure(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog once; later calls are ignored so embedders keep their own set-up."""
    global _configured
    if _configured:
        return
    _configured = True
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
