"""Logging: what evq's modules log through, and the set-up only a program entry point does.

A library must not print to its host's stdout nor configure logging for it, and structlog left
unconfigured prints every debug line to stdout.  So every evq module logs through
:func:`get_logger`: a structlog logger over the standard library's ``logging.getLogger(name)``.
structlog's processors (the host's, if it configured structlog) render the event, and the
``logging`` configuration of the host decides where it goes: with none, Python shows warnings
and errors on stderr and drops the rest.  The program entry point (the CLI, a test harness, an
embedding service that wants evq's records) calls :func:`configure`.  People read a console,
machines read JSON, so the choice follows whether stderr is a terminal.
"""

from __future__ import annotations

import logging
import sys

import structlog

_configured = False


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """The logger of module ``name``: structlog's API over ``logging.getLogger(name)``."""
    return structlog.wrap_logger(logging.getLogger(name))  # type: ignore[no-any-return]


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
    # evq's loggers hand the rendered line to ``logging``: one handler on stderr, as rendered.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.getLevelNamesMapping()[level.upper()])
