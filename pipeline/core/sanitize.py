"""What text from a training job may become in the sinks: the services' limits and the functions
that keep values within them.

Run ids, attempt ids, run metadata, labels and custom badput names are whatever a job sends.
Before one becomes a Cloud Monitoring label value or a BigQuery value it is made valid and short
enough here, the same way for every sink (DuckDB, the local stand-in of BigQuery, included), so a
run has the same id in every table:

- lone surrogates (text no UTF-8 encoder can write) become U+FFFD in every value;
- in identifiers and label values, characters Python does not call printable (control, format,
  separator characters: the test the parser applies to run ids) become U+FFFD, so that a value
  cannot break a log line, a dashboard legend or a terminal;
- a value longer than its limit is cut on a UTF-8 character boundary and ends with ``~`` and 16
  hex digits of the SHA-256 of the whole value: two long values that share a prefix stay two.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

#: Cloud Monitoring, user-defined metrics (https://cloud.google.com/monitoring/quotas): at most 30
#: labels per metric descriptor, label keys of at most 100 and values of at most 1024 ("string
#: length"; counted here in UTF-8 bytes, the stricter reading, so a value within it is within either).
GCM_MAX_LABELS = 30
GCM_MAX_LABEL_KEY = 100
GCM_MAX_LABEL_VALUE_BYTES = 1024
#: Label keys (https://cloud.google.com/monitoring/api/v3/naming-conventions): lower-case letters,
#: digits and underscores, starting with a letter.
GCM_LABEL_KEY = re.compile(rf"[a-z][a-z0-9_]{{0,{GCM_MAX_LABEL_KEY - 1}}}")

#: BigQuery streaming inserts (https://cloud.google.com/bigquery/quotas#streaming_inserts): at most
#: 10 MB per row and per HTTP request. A row here stays far below: identifiers are capped at
#: ``MAX_ID_BYTES``, free text at ``MAX_TEXT_BYTES`` (a JSON escape makes a byte at most 6, and a row
#: has at most two free-text columns), so no single row can make a request the service refuses.
MAX_ID_BYTES = 2048  # 512 characters (the parser's limit on run and attempt ids) of up to 4 bytes
MAX_TEXT_BYTES = 512 * 1024
#: Free-text columns: JSON documents, raw payloads and config values, kept as they came (control
#: characters included) but for lone surrogates and length. Every other STRING column is an identifier.
TEXT_COLUMNS = frozenset({"payload", "body", "labels", "reason", "note", "value"})

_DIGEST_CHARS = 17  # "~" and 16 hex digits
_SURROGATES = re.compile(r"[\ud800-\udfff]")


def truncate_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding has at most ``max_bytes`` bytes."""
    if len(text) * 4 <= max_bytes:
        return text
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return text
    return encoded[:max_bytes].decode("utf-8", "ignore")  # drops a character cut in two


def valid_utf8(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD."""
    return _SURROGATES.sub("\ufffd", text)


def printable(text: str) -> str:
    """``text`` with every character Python does not call printable replaced by U+FFFD."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else "\ufffd" for c in text)


def capped(text: str, max_bytes: int) -> str:
    """``text`` if it fits in ``max_bytes`` UTF-8 bytes; else its longest prefix that fits with a
    digest of the whole appended (``prefix~0123456789abcdef``)."""
    if len(text) * 4 <= max_bytes or len(text.encode("utf-8", "surrogatepass")) <= max_bytes:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_CHARS - 1]
    return truncate_utf8(text, max_bytes - _DIGEST_CHARS) + "~" + digest


def identifier(text: str, max_bytes: int = MAX_ID_BYTES) -> str:
    """An id or a short label as it may be stored: printable, valid UTF-8, at most ``max_bytes``."""
    if text.isascii() and text.isprintable() and len(text) <= max_bytes:
        return text  # the common case, in C
    return capped(printable(valid_utf8(text)), max_bytes)


def label_value(text: str) -> str:
    """A Cloud Monitoring label value (metric or resource label) made from any text."""
    return identifier(text, GCM_MAX_LABEL_VALUE_BYTES)


def free_text(text: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A JSON document or a raw payload as it may be stored: valid UTF-8, at most ``max_bytes``."""
    if text.isascii() and len(text) <= max_bytes:
        return text
    return capped(valid_utf8(text), max_bytes)


def clean_value(column: str, value: Any) -> Any:
    """A row's value for ``column`` made storable; values that are not text are returned as given."""
    if not isinstance(value, str):
        return value
    return free_text(value) if column in TEXT_COLUMNS else identifier(value)


def clean_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row whose every text value is storable (the same row object when nothing changes). A
    payload that had to be cut says so in the row's reason."""
    cleaned = None
    for column, value in row.items():
        if isinstance(value, str):
            fixed = clean_value(column, value)
            if fixed != value:
                if cleaned is None:
                    cleaned = dict(row)
                cleaned[column] = fixed
    if cleaned is None:
        return row
    payload, reason = row.get("payload"), cleaned.get("reason")
    if isinstance(payload, str) and isinstance(reason, str) and len(cleaned["payload"]) < len(payload):
        size = len(payload.encode("utf-8", "surrogatepass"))
        cleaned["reason"] = free_text(f"{reason} [the payload of {size} bytes is cut to {MAX_TEXT_BYTES}, "
                                      "ending in ~ and the first 16 hex digits of its SHA-256]")
    return cleaned
