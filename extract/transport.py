"""The HTTP paths under :class:`~membersync.extract.client.ServiceClient`: aiohttp directly (the
default), or httpx over an injectable transport; both answer ``(status, headers, body)``, and
their failures are the exceptions :data:`TRANSPORT_EXCEPTIONS` names (the client maps them to
its typed errors with :func:`~membersync.extract.errors.transport_error`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import httpx
import yarl
from membersync.extract.deadlines import Watch

try:
    import aiohttp

    HAVE_AIOHTTP = True
    TRANSPORT_EXCEPTIONS: tuple[type[BaseException], ...] = (
        httpx.RequestError,
        aiohttp.ClientError,
        OSError,
    )
except ImportError:  # pragma: no cover
    HAVE_AIOHTTP = False
    TRANSPORT_EXCEPTIONS = (httpx.RequestError, OSError)

JSON_HEADERS = {"Content-Type": "application/json"}
DEFAULT_HEADERS = {"Accept": "application/json", "User-Agent": "membersync"}


class DirectAiohttp:
    """The default HTTP path: aiohttp's ``ClientSession`` without httpx on top.

    Same wire behaviour as httpx over httpx-aiohttp's transport (the headers, HTTP Basic as
    httpx encodes it (UTF-8), no redirects followed, no cookies kept, no proxy or ``.netrc``
    from the environment, the connect/read/pool timeouts (the read timeout kept by the
    client's :class:`~membersync.extract.deadlines.Deadlines`), one pool of ``max_concurrency``
    connections kept alive 30 s, gzip/deflate decoded), without httpx's request, response,
    header and stream objects per request. aiohttp's exceptions reach
    :func:`~membersync.extract.errors.transport_error` unmapped, which classifies them.
    The session is opened on the first request (it needs the running loop).
    """

    def __init__(
        self, username: str, password: str, connect_timeout: float, pool_timeout: float, max_concurrency: int
    ) -> None:
        token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
        self._headers = {**DEFAULT_HEADERS, "Authorization": f"Basic {token}"}
        # No sock_read: the read timeout is the client's Deadlines' (one timer for every
        # attempt, not one re-armed per chunk received).
        self._timeout = aiohttp.ClientTimeout(
            sock_connect=connect_timeout, sock_read=None, connect=pool_timeout
        )
        self._limit = max_concurrency
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._limit, keepalive_timeout=30.0, ssl=httpx.create_ssl_context()
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            timeout=self._timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )
        return self._session

    async def fetch(
        self, method: str, url: yarl.URL, content: bytes | None, watch: Watch
    ) -> tuple[int, Mapping[str, str], bytes]:
        session = self._session or self._open()
        response = await session.request(
            method,
            url,
            data=content,
            headers=JSON_HEADERS if content is not None else None,
            allow_redirects=False,
        )
        watch.reading(response.content)  # the read timeout restarts while the body grows
        data = await response.read()  # releases the connection (closes it on an error)
        return response.status, response.headers, data

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _NoCookies(httpx.Cookies):
    def extract_cookies(self, response: httpx.Response) -> None:
        return None


_NO_COOKIES = _NoCookies()


class CookielessClient(httpx.AsyncClient):
    """An httpx client that neither keeps nor sends cookies.

    The service authenticates every request (Basic); it needs no cookies and we want no
    session state. httpx runs urllib's cookie jar over every response, which costs about a
    tenth of our CPU per request; this client skips it.
    """

    @property  # type: ignore[override]
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES

    @cookies.setter
    def cookies(self, value: Any) -> None:
        return None


def default_transport(kind: str, max_concurrency: int) -> httpx.AsyncBaseTransport:
    limits = httpx.Limits(
        max_connections=max_concurrency,
        max_keepalive_connections=max_concurrency,
        keepalive_expiry=30.0,
    )
    if kind == "aiohttp":
        from httpx_aiohttp import AiohttpTransport

        return AiohttpTransport(limits=limits)
    return httpx.AsyncHTTPTransport(limits=limits)
