"""One typed error tree for everything the service client can raise.

::

    ServiceError                     .endpoint, .status (None without an HTTP answer)
    ├── TransportError               no usable HTTP answer
    │   ├── ConnectError             refused / unreachable: the request never left us
    │   ├── ConnectionDropped        the connection broke after the request was (maybe) sent
    │   └── TimeoutError_
    │       ├── ConnectTimeoutError  never connected: the request never left us
    │       ├── PoolTimeoutError     no free connection: the request never left us
    │       ├── WriteTimeoutError    the request may have been partly sent
    │       └── ReadTimeoutError     sent, no answer in time
    ├── ProtocolError                answered 2xx, but not a JSON object in the contract's shape
    └── StatusError                  answered with an error status
        ├── BadRequestError          400 (.field: the field the message names, when found)
        ├── AuthenticationError      401
        ├── PermissionDeniedError    403
        ├── NotFoundError            404
        ├── ConflictError            409
        ├── RateLimitedError         429 (still, after the retries; .retry_after)
        ├── ServerError              5xx
        └── UnexpectedStatusError    any other status

Two class-level facts drive the retry policy (:mod:`membersync.extract.retry`):
``retryable`` (worth another try for a read) and ``may_have_reached`` (the server may have
acted on the request, so a write must not be sent again).

Secrets: the text of every error is built here from the endpoint's logical name, the
status, the error code and a scrubbed, shortened server message. It never holds a URL,
header, request body or credential. Errors raised from a transport exception are raised
``from None``: the original exception (which carries the request and its headers) is not
chained; its class name and a scrubbed message are kept in ``.detail``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import httpx
import orjson
from membersync.extract import constants, redact

try:  # aiohttp is optional at runtime: only the aiohttp transport needs it
    import aiohttp
except ImportError:  # pragma: no cover
    aiohttp = None  # type: ignore[assignment]


class ServiceError(Exception):
    """Root of every error the client raises. ``str()`` names endpoint and status."""

    retryable: ClassVar[bool] = False
    may_have_reached: ClassVar[bool] = True

    def __init__(self, endpoint: str, status: int | None = None, detail: str = "", attempts: int = 1):
        self.endpoint = endpoint
        self.status = status
        self.detail = detail
        self.attempts = attempts
        super().__init__(endpoint, status, detail)

    def __str__(self) -> str:
        status = f"HTTP {self.status}" if self.status is not None else "no HTTP answer"
        text = f"{self.endpoint}: {status}: {self.describe()}"
        if self.attempts > 1:
            text += f" (after {self.attempts} attempts)"
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def describe(self) -> str:
        return self.detail or type(self).__name__

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (Prefect may ship errors between processes)
        return (type(self)._rebuild, (self.__dict__.copy(),))

    @classmethod
    def _rebuild(cls, state: dict[str, Any]) -> ServiceError:
        err = cls.__new__(cls)
        Exception.__init__(err, state.get("endpoint"), state.get("status"), state.get("detail"))
        err.__dict__.update(state)
        return err


# -- no HTTP answer ------------------------------------------------------------------------


class TransportError(ServiceError):
    """No usable HTTP answer (network, timeout, broken connection)."""


class ConnectError(TransportError):
    retryable = True
    may_have_reached = False

    def describe(self) -> str:
        return f"could not connect ({self.detail})" if self.detail else "could not connect"


class ConnectionDropped(TransportError):
    retryable = True

    def describe(self) -> str:
        return f"connection dropped ({self.detail})" if self.detail else "connection dropped"


class TimeoutError_(TransportError):
    retryable = True

    def describe(self) -> str:
        what = type(self).__name__.removesuffix("Error").removesuffix("_")
        return f"{what} ({self.detail})" if self.detail else what


class ConnectTimeoutError(TimeoutError_):
    may_have_reached = False


class PoolTimeoutError(TimeoutError_):
    may_have_reached = False


class WriteTimeoutError(TimeoutError_):
    pass


class ReadTimeoutError(TimeoutError_):
    pass


# -- an answer that is not what the contract says ------------------------------------------


class ProtocolError(ServiceError):
    """A 2xx answer whose body is not JSON, not an object, or lacks the expected key."""

    retryable = True


# -- error statuses ------------------------------------------------------------------------


class StatusError(ServiceError):
    """The server answered with an error status. ``.code``/``.message`` from its error body."""

    def __init__(
        self,
        endpoint: str,
        status: int,
        code: str | None = None,
        message: str | None = None,
        attempts: int = 1,
    ):
        super().__init__(endpoint, status, "", attempts)
        self.code = code
        self.message = message

    def describe(self) -> str:
        parts = [self.code or type(self).__name__]
        if self.message:
            parts.append(self.message)
        return ": ".join(parts)


class BadRequestError(StatusError):
    @property
    def field(self) -> str | None:
        """The field the server's message names (first identifier-like word that is one)."""
        return _field_in(self.message or "")


class AuthenticationError(StatusError):
    pass


class PermissionDeniedError(StatusError):
    pass


class NotFoundError(StatusError):
    pass


class ConflictError(StatusError):
    pass


class RateLimitedError(StatusError):
    retryable = True
    may_have_reached = False  # a 429 is refused before any work is done

    def __init__(self, *args: Any, retry_after: float | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.retry_after = retry_after


class ServerError(StatusError):
    """5xx. Only 500/502/503/504 are transient; 501, 505, ... are final."""

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        return self.status in constants.RETRY_STATUSES


class UnexpectedStatusError(StatusError):
    pass


_BY_STATUS: dict[int, type[StatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    429: RateLimitedError,
}


def status_error(
    endpoint: str,
    status: int,
    body: bytes,
    *,
    retry_after: float | None = None,
    secrets: tuple[str, ...] = (),
) -> StatusError:
    """The typed error for an error status; the server's message is scrubbed and shortened."""
    code, message = _error_body(body)
    if message is not None:
        message = redact.scrub(message, extra=secrets)[: constants.MAX_ERROR_MESSAGE]
    if code is not None:
        code = redact.scrub(code, extra=secrets)[:80]
    cls = _BY_STATUS.get(status) or (ServerError if 500 <= status <= 599 else UnexpectedStatusError)
    if cls is RateLimitedError:
        return RateLimitedError(endpoint, status, code, message, retry_after=retry_after)
    return cls(endpoint, status, code, message)


def _error_body(body: bytes) -> tuple[str | None, str | None]:
    """``{"error": {"code", "message"}}`` when the body is that; a real server may send HTML."""
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None, None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        code, message = err.get("code"), err.get("message")
        return (str(code) if code is not None else None, str(message) if message is not None else None)
    if isinstance(err, str):
        return None, err
    return None, None


# a field name, or a path to one such as ``lines[0].productNumber`` (its last part is the field)
_IDENT = re.compile(r"[A-Za-z_]\w*(?:\[\d+\])?(?:\.[A-Za-z_]\w*(?:\[\d+\])?)*")
_KNOWN_FIELDS: frozenset[str] = frozenset()


def _field_in(message: str) -> str | None:
    global _KNOWN_FIELDS
    if not _KNOWN_FIELDS:
        from membersync.extract import catalogue, records

        names = {p.name for e in catalogue.ENDPOINTS for p in e.params}
        names |= {f for e in catalogue.ENDPOINTS for f in e.required}
        for value in vars(records).values():  # every field of every record and request body
            names |= set(getattr(value, "__annotations__", {}) if isinstance(value, type) else ())
        _KNOWN_FIELDS = frozenset(names)
    for path in _IDENT.findall(message):
        word = path.rsplit(".", 1)[-1].split("[", 1)[0]
        if word in _KNOWN_FIELDS:
            return word
    return None


# -- transport exceptions -> our tree ------------------------------------------------------


def transport_error(endpoint: str, exc: BaseException) -> TransportError | ProtocolError:
    """Classify an exception from httpx (either transport) or aiohttp into our tree.

    httpx-aiohttp 0.2 maps every ``aiohttp.ClientConnectionError`` that is not a connector
    error or a timeout -- notably ``ServerDisconnectedError``, a connection closed *after*
    the request was sent -- to ``httpx.ConnectTimeout``, and it lets unmapped aiohttp errors
    (e.g. a malformed status line) through unchanged. Both would mislead a write's retry
    decision, so the aiohttp exception behind the httpx one (``__cause__``) decides first.
    """
    origin = exc.__cause__ if aiohttp is not None and isinstance(exc.__cause__, aiohttp.ClientError) else exc
    detail = f"{type(origin).__name__}: {redact.scrub(str(origin))[:200]}".rstrip(": ")
    if aiohttp is not None and isinstance(origin, aiohttp.ClientError):
        cls = _aiohttp_class(origin)
    else:
        cls = _httpx_class(origin)
    return cls(endpoint, None, detail)


def _aiohttp_class(exc: BaseException) -> type[TransportError] | type[ProtocolError]:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectTimeoutError
    if isinstance(exc, aiohttp.ServerTimeoutError):  # SocketTimeoutError: no bytes within sock_read
        return ReadTimeoutError
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, DNS, unreachable
        return ConnectError
    if isinstance(exc, aiohttp.ClientResponseError):  # malformed status line or headers
        return ProtocolError
    if isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):  # our mistake: final
        return TransportError
    # ServerDisconnectedError, ClientOSError (reset), ClientPayloadError (body cut short), ...
    return ConnectionDropped


_HTTPX_CLASSES: tuple[tuple[type[BaseException], type[TransportError]], ...] = (
    (httpx.ConnectTimeout, ConnectTimeoutError),
    (httpx.PoolTimeout, PoolTimeoutError),
    (httpx.WriteTimeout, WriteTimeoutError),
    (httpx.ReadTimeout, ReadTimeoutError),
    (httpx.TimeoutException, ReadTimeoutError),
    (TimeoutError, ReadTimeoutError),  # a raw asyncio/OS timeout a transport let through
    (httpx.ConnectError, ConnectError),
    (httpx.UnsupportedProtocol, TransportError),  # a bad base URL: final
    (httpx.LocalProtocolError, TransportError),  # we built a bad request: final
)


def _httpx_class(exc: BaseException) -> type[TransportError] | type[ProtocolError]:
    for httpx_cls, ours in _HTTPX_CLASSES:
        if isinstance(exc, httpx_cls):
            return ours
    # RemoteProtocolError ("Server disconnected without sending a response"), ReadError,
    # WriteError, and anything else a transport raises mid-exchange.
    return ConnectionDropped
