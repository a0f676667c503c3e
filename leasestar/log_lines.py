"""Every line the server logs is one line, whatever a request holds.

A request's path, query and headers reach log lines: the access log's, and the messages
of the errors they cause (`leasestar.errors` names the path; an exception's message may
quote anything it was given). Written raw, a `%0a` in a path ends the line there and
what follows is a line of the attacker's making: `%0a{"status":200,...}` forged an
access line of the JSON log. So no value is written raw:

- in the `json` format every line is one JSON object (msgspec escapes every control
  character, and `one_line` the separators some readers also split lines at: U+0085,
  U+2028, U+2029), the server's own lines included (uvicorn's, Litestar's, ours):
  `{"time", "level", "logger", "message"}`, with `"exception"` holding a trace;
- in the `text` format (and with the access log `off`), every control character, those
  separators and the backslash are written as Python escapes (`\\n`, `\\x00`,
  `\\u2028`, `\\\\`), a trace included, so a record is one line there too.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import msgspec

# What ends or hides a line for some reader: C0 controls, DEL, C1 controls (U+0085 among
# them) and the Unicode line and paragraph separators.
_UNSAFE: Final = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
_TEXT_ESCAPES: Final = {
    **{code: ascii(chr(code))[1:-1] for code in _UNSAFE},
    ord("\\"): "\\\\",
}
# What msgspec's JSON leaves raw (it escapes U+0000-U+001F itself).
_JSON_ESCAPES: Final = {code: f"\\u{code:04x}" for code in _UNSAFE if code > 0x7E}
# The loggers uvicorn configures with handlers of its own (the app's records propagate to
# the root logger, which Litestar's logging configuration sets up: `logging_config`).
UVICORN_LOGGERS: Final = ("uvicorn", "uvicorn.error", "uvicorn.access")

_encoder = msgspec.json.Encoder()


def escaped(text: str) -> str:
    """`text` with every character that could end or hide a line written as an escape."""
    return text.translate(_TEXT_ESCAPES)


def one_line(json_text: str) -> str:
    """A JSON text with the line separators msgspec leaves raw escaped (valid JSON still)."""
    return json_text if json_text.isascii() else json_text.translate(_JSON_ESCAPES)


class _JsonRecord(msgspec.Struct, omit_defaults=True):
    time: str
    level: str
    logger: str
    message: str
    exception: str | None = None


class LogLineFormatter(logging.Formatter):
    """One line per record: a JSON object (`json`), or escaped text (`text`, `off`)."""

    def __init__(self, log_format: str = "text") -> None:
        super().__init__("%(levelname)s - %(asctime)s - %(name)s - %(message)s")
        self.json = log_format == "json"

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        trace = self.formatException(record.exc_info) if record.exc_info else None
        if record.stack_info:
            trace = (trace + "\n" if trace else "") + self.formatStack(record.stack_info)
        if self.json:
            line = _JsonRecord(self.formatTime(record), record.levelname, record.name, message)
            line.exception = trace
            return one_line(_encoder.encode(line).decode())
        text = f"{record.levelname} - {self.formatTime(record)} - {record.name} - {message}"
        return escaped(f"{text} | {trace}" if trace else text)


def install_formatter(log_format: str) -> None:
    """Write uvicorn's records as one line each too (its handlers format them, not the
    root logger's)."""
    formatter = LogLineFormatter(log_format)
    for name in UVICORN_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            handler.setFormatter(formatter)


def logging_formatters(log_format: str) -> dict[str, dict[str, Any]]:
    """The formatters of Litestar's logging configuration: its `standard` one, as ours."""
    return {"standard": {"()": LogLineFormatter, "log_format": log_format}}
