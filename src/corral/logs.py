"""How corral's long-running commands log: to standard error, one record a line, with no
secret in it.

Every record corral's handlers write, its own and its libraries' (an HTTP client's request
line, a driver's error), has the URLs in it redacted (redaction.redacted_text: no userinfo,
no value of a query parameter named in redaction.SECRET_NAMES). The HTTP client's own
request lines (httpx and httpcore at INFO) are not written at all: corral's run log
says what was sent, redacted. On a terminal records are drawn by rich; to a file or a
pipe they are plain lines, never wrapped; `log_format = "json"` writes one JSON object a
line.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

from corral import redaction

QUIET = ("alembic", "httpx", "httpcore", "hpack", "uvicorn.access")
"""Libraries whose INFO records are theirs, not the operator's: WARNING and above only."""


class Redacting(logging.Filter):
    """Rewrites each record's message with its URLs redacted (and its traceback's text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redaction.redacted_text(message)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redaction.redacted_text(
                logging.Formatter().formatException(record.exc_info)
            )
        elif record.exc_text:
            record.exc_text = redaction.redacted_text(record.exc_text)
        return True


class JsonLines(logging.Formatter):
    """One JSON object a record: at, level, logger, message (and the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_text:
            line["traceback"] = record.exc_text
        elif record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def handler(log_format: str, stream: IO[str] | None = None) -> logging.Handler:
    """The handler of `log_format` (text or json) writing to `stream` (standard error)."""
    stream = stream or sys.stderr
    made: logging.Handler
    if log_format == "json":
        made = logging.StreamHandler(stream)
        made.setFormatter(JsonLines())
    elif stream.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        made = RichHandler(console=Console(file=stream), show_path=False, rich_tracebacks=True)
        made.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        made = logging.StreamHandler(stream)
        made.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    made.addFilter(Redacting())
    return made


def setup(level: str, log_format: str = "text", stream: IO[str] | None = None) -> None:
    """Log at `level` through one handler of `log_format`, the libraries in QUIET at
    WARNING."""
    logging.basicConfig(level=level, handlers=[handler(log_format, stream)], force=True)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
