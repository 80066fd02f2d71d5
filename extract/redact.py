"""Keep credentials and secret values out of logs and error text.

Our own code never logs a URL with credentials, a header or a body. The libraries below
us (httpx, httpcore, aiohttp) log at DEBUG/INFO on their own, so :func:`install` puts a
:class:`RedactingFilter` on each of their loggers (child loggers included: a filter on a
parent logger does not see its children's records). The filter rewrites a record's text
when it holds:

- a registered secret (:func:`register_credentials`: the password, plain and URL-encoded,
  ``user:password`` and its base64, i.e. the ``Authorization: Basic`` value);
- any ``Authorization``/``Basic``/``Bearer`` value, credentials in a URL (``//user:pw@``);
- a ``name=value`` / ``"name": "value"`` pair whose name is a secret field of the contract
  (password, apiKey, tokenId, vaultToken, accountNo, routingNo, ...).

:func:`scrub` is the same rewrite for any text (our error messages use it). A night also
registers its mask of people's identity (:func:`register_identity_mask`): a vendor's error text
may name a client, and what is scrubbed (logs, errors, notifications, what Prefect records of a
failed task) then never holds it.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from collections.abc import Callable
from urllib.parse import quote, quote_plus

from membersync.extract import catalogue

MASK = "***"

# Loggers of the HTTP stack (and ours). Children are listed because logger filters do not
# apply to records that propagate up from child loggers.
LOGGER_NAMES = (
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
    "hpack",
    "aiohttp",
    "aiohttp.access",
    "aiohttp.client",
    "aiohttp.internal",
    "aiohttp.server",
    "aiohttp.web",
    "aiohttp.websocket",
    "membersync",
    "membersync.extract",
    "membersync.extract.client",
)
_PREFIXES = ("httpx", "httpcore", "hpack", "aiohttp", "membersync")

# Names whose value is masked wherever ``name: value`` or ``name=value`` shows in a log line:
# the catalogue's secret fields, and the Authorization header.
SECRET_FIELD_NAMES: tuple[str, ...] = (*sorted(catalogue.SECRET_FIELDS), "authorization")

# Each pattern's group ``secret`` is what is masked.
_PATTERNS = (
    # Authorization header in any rendering: "Authorization: Basic x", (b'authorization', b'Basic x')
    re.compile(r"(?i)authorization['\"]?\s*[:=,]\s*b?['\"]?(?P<secret>[^'\"\s,)}\]]+(\s+[^'\"\s,)}\]]+)?)"),
    re.compile(r"(?i)\b(basic|bearer)\s+(?P<secret>[A-Za-z0-9+/=._~-]{4,})"),
    re.compile(r"//(?P<secret>[^/@\s:]+:[^/@\s]*)@"),  # credentials in a URL
    re.compile(
        r"(?i)[\"']?\b(?:"
        + "|".join(SECRET_FIELD_NAMES)
        + r")\b[\"']?\s*[:=]\s*b?[\"']?(?P<secret>[^\"'&,\s}\]]+)"
    ),
)

_secrets: set[str] = set()
_identity_mask: list[Callable[[str], str]] = []  # the running night's (at most one)
_lock = threading.Lock()
_installed = False


def register_identity_mask(mask: Callable[[str], str] | None) -> None:
    """Apply ``mask`` (text -> text without people's identity) to everything :func:`scrub`
    rewrites, from now on; ``None`` removes it. One at a time: the night that runs."""
    with _lock:
        _identity_mask[:] = [mask] if mask is not None else []


def register_secret(value: str | None) -> None:
    """Mask this exact value wherever it appears (values shorter than 4 chars are ignored)."""
    if value and len(value) >= 4:
        with _lock:
            _secrets.add(value)


def register_credentials(username: str, password: str) -> None:
    """Register every rendering of Basic credentials that could reach a log line."""
    pair = f"{username}:{password}"
    for value in (
        password,
        quote(password, safe=""),
        quote_plus(password),
        pair,
        quote(pair, safe=""),
        base64.b64encode(pair.encode()).decode(),
    ):
        register_secret(value)


def scrub(text: str, extra: tuple[str, ...] = ()) -> str:
    """``text`` with registered secrets, ``extra`` values and credential patterns masked. Every
    span is found in the text as given, then all are masked at once: a password that is also a
    field's name (``password``) masks the name and still lets the pattern find its value."""
    if not text:
        return text
    spans: list[tuple[int, int]] = []
    for secret in (*_secrets, *extra):
        if secret and len(secret) >= 4:
            start = text.find(secret)
            while start != -1:
                spans.append((start, start + len(secret)))
                start = text.find(secret, start + 1)
    spans += [m.span("secret") for pattern in _PATTERNS for m in pattern.finditer(text)]
    masked = _masked(text, spans)
    for mask in _identity_mask:
        masked = mask(masked)
    return masked


def _masked(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each run of overlapping or touching spans replaced by one MASK."""
    out: list[str] = []
    at = 0
    for start, end in sorted(spans):
        if start > at or not out:
            out += [text[at:start], MASK]
        at = max(at, end)
    return "".join(out) + text[at:]


class RedactingFilter(logging.Filter):
    """Rewrites a record's message (and traceback text) with :func:`scrub`; never drops it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep only the template, masked
            message = str(record.msg)
        clean = scrub(message)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_info, record.exc_text = None, scrub(text)
        elif record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


_FILTER = RedactingFilter()


def install() -> None:
    """Put the filter on every HTTP-stack logger (idempotent; new child loggers on each call)."""
    global _installed
    names = set(LOGGER_NAMES)
    names.update(n for n in logging.root.manager.loggerDict if n.startswith(_PREFIXES))
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    _installed = True
