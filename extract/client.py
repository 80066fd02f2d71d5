"""The one async client of the service: every endpoint of the catalogue as a typed method.

::

    async with ServiceClient(base_url, username, password) as client:
        stores = await client.storelist()                    # list of items, logical names
        details = await client.clientdetails("000417")       # the unwrapped object
        async for page in client.search(modifiedSince=since):
            ...
        answer = await client.insert_payment(receiptNumber=r, paymentType="CASH", amount="10.00")

Every method is a one-liner over :meth:`ServiceClient._get` / :meth:`ServiceClient._post`
with its :class:`~membersync.extract.catalogue.Endpoint`; what differs between endpoints
(path, parameters, wrapper key, record type) is data, in the catalogue and the tenant
profile. One request goes: concurrency slot -> (the caller's gate, if any) -> rate slot (both
slots adaptive, see :mod:`membersync.extract.limits`) -> aiohttp (or httpx) -> status check ->
orjson -> unwrap -> rename to logical names (skipped when the profile is the contract's).
Failures become the typed errors of :mod:`membersync.extract.errors` and are retried as
:mod:`membersync.extract.retry` decides.

Credentials travel only in the Authorization header (HTTP Basic): never in a URL, a log line or an
error. The HTTP stack's loggers get a redacting filter (:mod:`membersync.extract.redact`).

By default requests go straight to aiohttp (one ``ClientSession``, see
:mod:`membersync.extract.transport`):
without httpx's request, response, header and stream objects per request, a night's marginal
CPU per request fell from 0.80 to 0.29 ms (``python -m membersync.flows.benchmarks.cpu marginal``).
Pass ``transport=`` to go through httpx with another transport (``httpx.MockTransport`` in
unit tests), or set ``ClientOptions(transport="httpx")`` for httpx's own; httpx over
httpx-aiohttp costs about a third of httpx's own transport's CPU per request (measured with
``python -m membersync.flows.benchmarks.transport``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, Literal, Unpack
from urllib.parse import quote, urlsplit

import httpx
import orjson
import yarl
from membersync.extract import catalogue, constants, redact
from membersync.extract.catalogue import Endpoint
from membersync.extract.concurrency import AdaptiveConcurrency, InFlightCap
from membersync.extract.deadlines import Deadlines
from membersync.extract.errors import (
    ProtocolError,
    RateLimitedError,
    ServiceError,
    status_error,
    transport_error,
)
from membersync.extract.limits import RateLimiter, parse_rate_headers
from membersync.extract.paging import PageNumberPaging, page_numbers
from membersync.extract.profile import Profile
from membersync.extract.records import (
    AddReferralBody,
    AffiliatedClient,
    AffiliatedPackageBody,
    BalanceAnswer,
    BillingAccount,
    BillingAccountAnswer,
    CancelMembershipBody,
    ChangeMembershipBody,
    Client,
    ClientAnswer,
    ClientMembership,
    ClientPackage,
    CodeDescription,
    CommentAnswer,
    CommPrefs,
    CountAnswer,
    EftDrawDay,
    EftMembershipInfo,
    Employee,
    FreezeMembershipBody,
    GenerateWebDocumentBody,
    GiftCertAnswer,
    InsertClientAnswer,
    InsertClientBody,
    InsertCommentBody,
    InsertGiftCertBody,
    InsertMembershipBody,
    InsertPaymentBody,
    InsertPointsBody,
    InsertProfileAnswersBody,
    InsertTransactionBody,
    LedgerBalance,
    LoginAnswer,
    LoginBody,
    MembershipAnswer,
    MembershipBody,
    MembershipIdAnswer,
    NonEftMembershipInfo,
    PackageInfo,
    PaymentAnswer,
    PaymentType,
    PointsAnswer,
    PointsBalance,
    PointsTransaction,
    PostAccountLedgerPaymentBody,
    PreferencesAnswer,
    ProcessorCredentials,
    Product,
    ProfileQuestion,
    ReceiptAnswer,
    ReferralAnswer,
    RegisterAnswer,
    RegisterUserBody,
    ResetAnswer,
    ResetPasswordBody,
    SearchPage,
    SharedClientsAnswer,
    StoreInfo,
    Transaction,
    UpdateBillingInfoBody,
    UpdateCommPrefsBody,
    UpdateDemographicsBody,
    UrlAnswer,
    WebDoc,
)
from membersync.extract.retry import parse_retry_after, retry_delay, should_retry
from membersync.extract.settings import ServiceSettings, Settings
from membersync.extract.transport import (
    DEFAULT_HEADERS,
    HAVE_AIOHTTP,
    JSON_HEADERS,
    TRANSPORT_EXCEPTIONS,
    CookielessClient,
    DirectAiohttp,
    default_transport,
)

logger = logging.getLogger(__name__)

_E = catalogue.BY_NAME
_ANNOUNCE_PROBE = 20  # answers without RateLimit-* headers before we stop looking (but on 429s)
# Body fields whose values a server's error message must never echo into our error text.
_SECRET_BODY_FIELDS = frozenset(redact.SECRET_FIELD_NAMES)
_NESTED_RECORDS = catalogue.NESTED_RECORDS
_ANSWER_RECORDS = catalogue.ANSWER_RECORDS


# -- options and statistics ------------------------------------------------------------------


# The ClientOptions fields a setting (MEMBERSYNC_<NAME>) may change.
CLIENT_SETTINGS = (
    "rate",
    "max_concurrency",
    "connect_timeout",
    "read_timeout",
    "request_timeout",
    "max_retries",
)


@dataclass(frozen=True)
class ClientOptions:
    """Tunables of one client. Defaults live in :mod:`membersync.extract.constants`.

    ``rate``: a client-side cap in req/s (None: no cap; the adaptive rate still backs off on
    429s). ``adaptive``: AIMD on rate and concurrency (False: fixed ``rate`` and
    ``max_concurrency``). ``clock``/``wall_clock``/``sleep``/``rand`` are for tests.
    """

    connect_timeout: float = constants.CONNECT_TIMEOUT
    read_timeout: float = constants.READ_TIMEOUT
    write_timeout: float = constants.WRITE_TIMEOUT
    pool_timeout: float = constants.POOL_TIMEOUT
    request_timeout: float = constants.REQUEST_TIMEOUT
    max_retries: int = constants.MAX_RETRIES
    backoff_base: float = constants.BACKOFF_BASE
    backoff_max: float = constants.BACKOFF_MAX
    retry_after_max: float = constants.RETRY_AFTER_MAX
    rate: float | None = None
    initial_rate: float | None = None  # where the rate finder starts (the rate a previous night found)
    start_rate: float | None = None  # knowing no rate, the slow start begins here (a night took it unrefused)
    max_concurrency: int = constants.MAX_CONCURRENCY
    initial_concurrency: int = constants.INITIAL_CONCURRENCY
    adaptive: bool = True
    transport: Literal["aiohttp", "httpx"] = "aiohttp"
    page_size: int | None = None  # search page size; None = the profile's
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rand: Callable[[], float] = random.random
    # Awaited before every attempt (retries too): a rate limit shared with other processes
    # (e.g. a Prefect global rate limit, see membersync.flows.pool.tenant_flow); None: none.
    gate: Callable[[], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be > 0 req/s, or None for no cap")
        for name in ("connect_timeout", "read_timeout", "write_timeout", "pool_timeout", "request_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 seconds")

    @classmethod
    def from_settings(cls, settings: Settings) -> ClientOptions:
        """Defaults overridden by ``MEMBERSYNC_RATE`` (req/s cap), ``MEMBERSYNC_MAX_CONCURRENCY``,
        ``MEMBERSYNC_CONNECT_TIMEOUT``, ``MEMBERSYNC_READ_TIMEOUT``, ``MEMBERSYNC_REQUEST_TIMEOUT``
        (seconds) and ``MEMBERSYNC_MAX_RETRIES``."""
        return cls(**{name: getattr(settings, name) for name in CLIENT_SETTINGS})

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(
            connect=self.connect_timeout,
            read=self.read_timeout,
            write=self.write_timeout,
            pool=self.pool_timeout,
        )


@dataclass(slots=True)
class ClientStats:
    """What one client did. ``requests`` counts HTTP attempts (retries included);
    ``errors`` the calls that ended in an error raised to the caller; ``transport_errors``
    the attempts that got no HTTP answer; ``latency_sum`` seconds over answered attempts."""

    requests: int = 0
    retries: int = 0
    status_429: int = 0
    errors: int = 0
    transport_errors: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    bytes: int = 0
    latency_sum: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        answered = sum(self.by_status.values())
        return {
            "requests": self.requests,
            "retries": self.retries,
            "status_429": self.status_429,
            "errors": self.errors,
            "transport_errors": self.transport_errors,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "bytes": self.bytes,
            "latency_sum": round(self.latency_sum, 6),
            "latency_avg_ms": round(1000 * self.latency_sum / answered, 3) if answered else None,
        }


# -- per-endpoint preparation (once per client) ------------------------------------------------


@dataclass(slots=True)
class _Prepared:
    endpoint: Endpoint
    url: httpx.URL  # absolute, without query
    yurl: yarl.URL  # the same for the direct aiohttp path
    wrapper: str | None
    names: dict[str, str]  # logical param -> wire param, percent-encoded
    convert: Callable[[Any], Any] | None  # wire item -> logical item; None = identical
    body_renames: bool = False  # a write whose body fields have other names on the wire
    known: frozenset[str] = frozenset()  # its logical parameter names
    required: tuple[str, ...] = ()  # those it cannot do without


def _with_query_parsed(base: httpx.URL, query: str) -> httpx.URL:
    """``base`` with an already percent-encoded ``query``, without parsing the URL again.

    httpx 0.28 keeps a parsed URL as a named tuple (``_uri_reference``); replacing its query
    is ~15x cheaper than parsing the whole string for every request. httpx is pinned below
    0.29, and :data:`_with_query` falls back to parsing where the internals differ.
    """
    url = httpx.URL.__new__(httpx.URL)
    url._uri_reference = base._uri_reference._replace(query=query)  # type: ignore[attr-defined]
    return url


def _with_query_slow(base: httpx.URL, query: str) -> httpx.URL:
    return httpx.URL(f"{base}?{query}")


def _pick_with_query() -> Callable[[httpx.URL, str], httpx.URL]:
    probe = httpx.URL("http://h/p")
    try:
        fast = _with_query_parsed(probe, "a=%20b")
    except AttributeError:
        return _with_query_slow
    return _with_query_parsed if fast == _with_query_slow(probe, "a=%20b") else _with_query_slow


_with_query = _pick_with_query()


def _has_renames(profile: Profile, record: str) -> bool:
    return any(wire != logical for logical, wire in profile.fields.get(record, {}).items())


def _converter(profile: Profile, record: str | None) -> Callable[[Any], Any] | None:
    """A function renaming one wire item (and its nested records) to logical names, or None."""
    if record is None:
        return None
    top = _has_renames(profile, record)
    nested = {k: r for k, r in _NESTED_RECORDS.get(record, {}).items() if _has_renames(profile, r)}
    if not top and not nested:
        return None

    def convert(item: Any) -> Any:
        if top:
            item = profile.to_logical(record, item)
        if nested and isinstance(item, dict):
            for key, sub_record in nested.items():
                sub = item.get(key)
                if isinstance(sub, list):
                    item[key] = [profile.to_logical(sub_record, s) for s in sub]
        return item

    return convert


def _query_value(value: Any) -> str:
    """A query parameter's value, percent-encoded."""
    if type(value) is int:
        return str(value)  # digits and "-": nothing to encode
    return quote(_wire_value(value), safe="")


def _wire_value(value: Any) -> str:
    if type(value) is str:
        return value
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")  # naive datetimes are taken as UTC
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)  # the contract accepts money as a numeric string: exact to the cent
    raise TypeError(f"cannot send a {type(value).__name__} as JSON")


# -- the client ----------------------------------------------------------------------------------


def _check_endpoint(base_url: str, username: str, password: str) -> None:
    """A ServiceClient's arguments: an http(s) URL without credentials in it, and both credentials."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("base_url must be an http(s) URL such as http://127.0.0.1:8700")
    if parts.username or parts.password or "@" in parts.netloc:
        raise ValueError("base_url must not carry credentials: pass username and password")
    if not username or not password:
        raise ValueError("username and password are required")


class ServiceClient:
    """Async client of the service (contract section B). Use as ``async with`` or call :meth:`aclose`."""

    def __init__(
        self,
        base_url: str,
        username: str,
        password: str,
        *,
        profile: Profile | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        options: ClientOptions | None = None,
    ) -> None:
        _check_endpoint(base_url, username, password)
        redact.register_credentials(username, password)
        redact.install()
        self.options = opts = options or ClientOptions()
        self.profile = profile or Profile.default()
        self.base_url = base_url.rstrip("/")
        self.stats = ClientStats()
        self._sleep = opts.sleep
        self._clock = opts.clock
        self.concurrency = AdaptiveConcurrency(
            opts.max_concurrency, initial=opts.initial_concurrency, adaptive=opts.adaptive
        )
        self.cap = InFlightCap(opts.max_concurrency, adaptive=opts.adaptive)
        self.rate = RateLimiter(
            cap=opts.rate,
            initial=opts.initial_rate,
            start=opts.start_rate,
            adaptive=opts.adaptive,
            clock=opts.clock,
            sleep=opts.sleep,
        )
        # Whether answers carry RateLimit-* headers: looked for until a few answers said nothing
        # (then only on 429s), so a server that never announces costs no header parsing.
        self._announces: bool | None = None
        self.paging = PageNumberPaging.from_profile(self.profile, opts.page_size)
        self._open_http_path(opts, username, password, transport)
        self._prepared = {e.name: self._prepare(e) for e in catalogue.ENDPOINTS}

    def _open_http_path(
        self, opts: ClientOptions, username: str, password: str, transport: httpx.AsyncBaseTransport | None
    ) -> None:
        """The HTTP path and every attempt's deadlines. The default goes straight to aiohttp (a
        third of the CPU per request of httpx over httpx-aiohttp); an injected transport or
        ``transport="httpx"`` goes through httpx."""
        self._direct: DirectAiohttp | None = None
        self._http: httpx.AsyncClient | None = None
        direct = transport is None and opts.transport == "aiohttp" and HAVE_AIOHTTP
        # Every attempt's deadline, and on the direct path its read timeout too, in one timer.
        self._deadlines = Deadlines(
            read_timeout=opts.read_timeout if direct else None,
            request_timeout=opts.request_timeout,
            connect_timeout=opts.connect_timeout,
        )
        if direct:
            self._direct = DirectAiohttp(
                username, password, opts.connect_timeout, opts.pool_timeout, opts.max_concurrency
            )
        else:
            self._http = CookielessClient(
                auth=httpx.BasicAuth(username, password),
                transport=transport or default_transport(opts.transport, opts.max_concurrency),
                timeout=opts.timeout(),
                headers=DEFAULT_HEADERS,
                follow_redirects=False,
                trust_env=False,  # no .netrc credentials or proxy settings picked up behind our back
            )

    def __repr__(self) -> str:
        return f"ServiceClient({self.base_url!r})"

    @classmethod
    def from_settings(cls, settings: ServiceSettings, options: ClientOptions | None = None) -> ServiceClient:
        return cls(
            settings.base_url,
            settings.username.get_secret_value(),
            settings.password.get_secret_value(),
            profile=settings.profile(),
            options=options,
        )

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._direct is not None:
            await self._direct.aclose()
        if self._http is not None:
            await self._http.aclose()

    def _prepare(self, ep: Endpoint) -> _Prepared:
        names = {p.name: quote(self.profile.param(p.name), safe="") for p in ep.params}
        yurl = yarl.URL(self.base_url + ep.path)
        return _Prepared(
            endpoint=ep,
            url=httpx.URL(self.base_url + ep.path),
            yurl=yurl,
            wrapper=self.profile.wrapper(ep),
            names=names,
            convert=_converter(self.profile, ep.record if ep.method == "GET" else ep.name),
            body_renames=ep.is_write and _has_renames(self.profile, ep.name),
            known=frozenset(p.name for p in ep.params),
            required=tuple(p.name for p in ep.params if p.required),
        )

    # -- generic calls -------------------------------------------------------------------------

    async def get(self, endpoint_name: str, **params: Any) -> Any:
        """Any GET endpoint by logical name, with logical parameter names; unwrapped answer
        (a list of items, an object, or a :class:`SearchPage` for ``search``)."""
        # (an unknown name: catalogue.endpoint raises the KeyError that names it)
        prep = self._prepared.get(endpoint_name) or self._prepared[catalogue.endpoint(endpoint_name).name]
        ep, known = prep.endpoint, prep.known
        if ep.method != "GET":
            raise ValueError(f"{endpoint_name} is a {ep.method} endpoint: use post()")
        if not known.issuperset(params):
            unknown = sorted(set(params) - known)
            raise ValueError(f"{endpoint_name}: unknown parameter {unknown[0]!r} (known: {sorted(known)})")
        for name in prep.required:
            if params.get(name) is None:
                raise ValueError(f"{endpoint_name}: parameter {name!r} is required")
        if ep.kind == "search":
            page = params.pop("page", None) or self.paging.first()
            return await self.search_page(page, params.pop("pageSize", None), **params)
        return await self._get(ep, **params)  # (_get is no coroutine: no frame of its own per resume)

    async def post(self, endpoint_name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Any write endpoint by logical name; the answer object (logical names)."""
        ep = catalogue.endpoint(endpoint_name)
        if ep.method != "POST":
            raise ValueError(f"{endpoint_name} is a {ep.method} endpoint: use get()")
        result: dict[str, Any] = await self._post(ep, body)
        return result

    def _get(self, ep: Endpoint, **params: Any) -> Awaitable[Any]:
        """The GET's request loop (a coroutine to await)."""
        prep = self._prepared[ep.name]
        return self._call(prep, self._query_url(prep, params), None, None)

    def _query_url(self, prep: _Prepared, params: Mapping[str, Any]) -> httpx.URL | yarl.URL:
        names = prep.names
        # The query is encoded here, once, and joined to the endpoint's parsed URL: handing
        # httpx a URL string costs a parse (~35 us), ``params=`` three.
        query = "&".join([f"{names[k]}={_query_value(v)}" for k, v in params.items() if v is not None])
        if not query:
            return prep.yurl if self._direct is not None else prep.url
        if self._direct is None:
            return _with_query(prep.url, query)
        # Already encoded: yarl must not quote it again. Built from the endpoint's parts, not
        # parsed from a string: every request's URL is new, so yarl's parse cache never hits
        # (1.3 us against 3.7 us a URL).
        yurl = prep.yurl
        return yarl.URL.build(
            scheme=yurl.scheme,
            authority=yurl.raw_authority,
            path=yurl.raw_path,
            query_string=query,
            encoded=True,
        )

    async def _post(self, ep: Endpoint, body: Mapping[str, Any]) -> Any:
        prep = self._prepared[ep.name]
        wire = self.profile.to_wire(ep.name, dict(body)) if prep.body_renames else body
        content = orjson.dumps(wire, default=_json_default)
        url = prep.yurl if self._direct is not None else prep.url
        return await self._call(prep, url, content, body)  # logical body: names its secrets

    # -- the request loop ------------------------------------------------------------------------

    async def _call(
        self,
        prep: _Prepared,
        url: httpx.URL | yarl.URL,
        content: bytes | None,
        body: Mapping[str, Any] | None,
    ) -> Any:
        method = prep.endpoint.method
        opts = self.options
        retries = 0
        while True:
            try:
                return await self._attempt(prep, url, content, body)
            except ServiceError as err:
                if not should_retry(method, err, retries, opts.max_retries):
                    err.attempts = retries + 1
                    self.stats.errors += 1
                    raise
                delay = retry_delay(
                    retries,
                    getattr(err, "retry_after", None),
                    base=opts.backoff_base,
                    cap=opts.backoff_max,
                    retry_after_cap=opts.retry_after_max,
                    rand=opts.rand,
                )
                retries += 1
                self.stats.retries += 1
                logger.debug("retry %d of %s in %.3fs after %s", retries, prep.endpoint.name, delay, err)
                await self._sleep(delay)

    async def _attempt(
        self,
        prep: _Prepared,
        url: Any,  # yarl.URL on the direct aiohttp path, else httpx.URL
        content: bytes | None,
        body: Mapping[str, Any] | None,
    ) -> Any:
        ep = prep.endpoint
        stats = self.stats
        success = False
        await self.concurrency.acquire()
        try:
            gate = self.options.gate
            if gate is not None:
                await gate()
            await self.rate.wait_turn()
            stats.requests += 1
            cap = self.cap
            level = await cap.sent()
            started = self._clock()  # after the wire's gate: the latency is the server's, not the wait
            try:
                status, headers, data = await self._send(ep, url, content)
            finally:
                cap.done()
            now = self._clock()
            by_status = stats.by_status
            by_status[status] = by_status.get(status, 0) + 1
            stats.bytes += len(data)
            stats.latency_sum += now - started
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s %s -> %d in %.1f ms", ep.method, ep.name, status, 1000 * (now - started))
            if status >= 300 or status < 200:
                raise self._status_error(prep, status, headers, data, (started, now, level), body)
            result = self._unwrap(prep, data, status)
            if self._announces is not False:
                self._read_announcement(headers)
            rate = self.rate
            rate.on_success(now, now - started)
            cap.accepted(level, now)
            self.concurrency.keep_up(rate.rate, rate.latency)
            success = True
            return result
        finally:
            self.concurrency.release(success)

    async def _send(
        self, ep: Endpoint, url: Any, content: bytes | None
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request on the wire: status, headers, body; a transport failure as a typed error."""
        try:
            # The whole attempt has a deadline (a trickling server resets the read timeout
            # with every byte), and on the direct path the read timeout is kept beside it;
            # either surfaces as the builtin TimeoutError -> ReadTimeoutError.
            async with self._deadlines.attempt() as watch:
                if self._direct is not None:
                    return await self._direct.fetch(ep.method, url, content, watch)
                assert self._http is not None
                response = await self._http.request(
                    ep.method, url, content=content, headers=JSON_HEADERS if content is not None else None
                )
                return response.status_code, response.headers, response.content
        except TRANSPORT_EXCEPTIONS as exc:
            self.stats.transport_errors += 1
            error = transport_error(ep.name, exc)
            logger.debug("%s %s -> %s", ep.method, ep.name, type(error).__name__)
            raise error from None

    def _status_error(
        self,
        prep: _Prepared,
        status: int,
        headers: Mapping[str, str],
        data: bytes,
        sent: tuple[float, float, int],  # when it was sent, answered, and its level in flight
        body: Mapping[str, Any] | None,
    ) -> ServiceError:
        retry_after = None
        if status in constants.RETRY_STATUSES:
            retry_after = parse_retry_after(
                headers.get("retry-after"),
                self.options.wall_clock(),
                cap=self.options.retry_after_max,
            )
        if status == 429:
            self.stats.status_429 += 1
            self._read_announcement(headers)
            self._rate_limited(sent, retry_after)
        secrets = _secret_values(body) if body else ()
        error = status_error(prep.endpoint.name, status, data, retry_after=retry_after, secrets=secrets)
        if retry_after is not None and not isinstance(error, RateLimitedError):
            error.retry_after = retry_after  # type: ignore[attr-defined]  # 503 + Retry-After
        return error

    def _rate_limited(self, sent: tuple[float, float, int], retry_after: float | None) -> None:
        """A 429: a cap on requests in flight holds fewer at once and leaves the pace alone;
        any other cuts the pace, and the concurrency with it, once per episode."""
        started, now, level = sent
        if self.cap.refused(level, now):
            return
        if self.rate.on_rate_limited(started, retry_after):
            self.concurrency.on_rate_limited()

    def _read_announcement(self, headers: Mapping[str, str]) -> None:
        announced = parse_rate_headers(headers, self.options.wall_clock())
        if announced is not None:
            self._announces = True
            self.rate.on_announced(announced)
        elif self._announces is None and self.stats.requests >= _ANNOUNCE_PROBE:
            self._announces = False

    def _unwrap(self, prep: _Prepared, data: bytes, status: int) -> Any:
        ep = prep.endpoint
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ProtocolError(ep.name, status, f"body is not JSON ({len(data)} bytes)") from None
        if type(answer) is not dict:
            raise ProtocolError(ep.name, status, f"body is a JSON {type(answer).__name__}, not an object")
        if ep.kind == "search":
            return self._search_answer(prep, answer, status)
        if ep.method == "POST":
            return self._write_answer(prep, answer, status)
        wrapper = prep.wrapper
        value = answer.get(wrapper)  # type: ignore[arg-type]
        convert = prep.convert
        if ep.shape == "object":
            if type(value) is not dict:
                raise ProtocolError(ep.name, status, f"answer has no object under {wrapper!r}")
            return convert(value) if convert else value
        if type(value) is not list:
            raise ProtocolError(ep.name, status, f"answer has no list under {wrapper!r}")
        return [convert(item) for item in value] if convert else value

    def _search_answer(
        self, prep: _Prepared, answer: dict[str, Any], status: int
    ) -> tuple[Any, dict[str, Any]]:
        items = answer.get(prep.wrapper)  # type: ignore[arg-type]
        if type(items) is not list:
            raise ProtocolError(prep.endpoint.name, status, f"answer has no list under {prep.wrapper!r}")
        convert = prep.convert
        return ([convert(i) for i in items] if convert else items), answer

    def _write_answer(self, prep: _Prepared, answer: dict[str, Any], status: int) -> dict[str, Any]:
        ep = prep.endpoint
        if prep.convert:
            answer = prep.convert(answer)
        for key, record in _ANSWER_RECORDS.items():
            value = answer.get(key)
            if value is not None and key in ep.answer and _has_renames(self.profile, record):
                if isinstance(value, list):
                    answer[key] = [self.profile.to_logical(record, v) for v in value]
                else:
                    answer[key] = self.profile.to_logical(record, value)
        missing = [f for f in ep.answer if f not in answer]
        if missing:
            raise ProtocolError(ep.name, status, f"answer lacks {missing[0]!r}")
        return answer

    # -- paging ----------------------------------------------------------------------------------

    async def search_page(self, page: int, page_size: int | None = None, **criteria: Any) -> SearchPage:
        """One page of ``clients/search`` (criteria: storecode, lastName, firstName, email,
        phone, modifiedSince as datetime (UTC) or str)."""
        unknown = sorted(set(criteria) - set(catalogue.SEARCH_CRITERIA))
        if unknown:
            raise ValueError(
                f"search: unknown criterion {unknown[0]!r} (known: {list(catalogue.SEARCH_CRITERIA)})"
            )
        size = page_size or self.paging.page_size
        items, answer = await self._get(_E["search"], page=page, pageSize=size, **criteria)
        number, size_answered, total = page_numbers(answer, self.profile, page, size)
        return SearchPage(items=items, page=number, page_size=size_answered, total_count=total)

    async def search(self, **criteria: Any) -> AsyncIterator[SearchPage]:
        """Every page of ``clients/search`` for these criteria, in order."""
        paging = self.paging
        number: int | None = paging.first()
        seen = 0
        while number is not None:
            page = await self.search_page(number, paging.page_size, **criteria)
            seen += len(page.items)
            yield page
            number = paging.next(page, seen)

    # -- configuration ---------------------------------------------------------------------------

    async def packagelist(self) -> list[PackageInfo]:
        return await self._get(_E["packagelist"])

    async def storelist(self) -> list[StoreInfo]:
        return await self._get(_E["storelist"])

    async def eft_memberships(self) -> list[EftMembershipInfo]:
        return await self._get(_E["eft_memberships"])

    async def noneft_memberships(self) -> list[NonEftMembershipInfo]:
        return await self._get(_E["noneft_memberships"])

    async def eft_deduct_types(self) -> list[CodeDescription]:
        return await self._get(_E["eft_deduct_types"])

    async def eft_draw_days(self) -> list[EftDrawDay]:
        return await self._get(_E["eft_draw_days"])

    async def skin_types(self) -> list[CodeDescription]:
        return await self._get(_E["skin_types"])

    async def webdocs(self) -> list[WebDoc]:
        return await self._get(_E["webdocs"])

    async def payment_types(self, storecode: str) -> list[PaymentType]:
        return await self._get(_E["payment_types"], storecode=storecode)

    async def employees(self, storecode: str) -> list[Employee]:
        return await self._get(_E["employees"], storecode=storecode)

    async def products(self, storecode: str) -> list[Product]:
        return await self._get(_E["products"], storecode=storecode)

    async def processor_credentials(self, storecode: str, type: str) -> list[ProcessorCredentials]:
        return await self._get(_E["processor_credentials"], storecode=storecode, type=type)

    async def profile_questions(self) -> list[ProfileQuestion]:
        return await self._get(_E["profile_questions"])

    # -- client reads ----------------------------------------------------------------------------

    async def clientdetails(self, client_number: str) -> Client:
        return await self._get(_E["clientdetails"], clientNumber=client_number)

    async def ledgerbalance(self, client_number: str) -> list[LedgerBalance]:
        return await self._get(_E["ledgerbalance"], clientNumber=client_number)

    async def commprefs(self, client_number: str) -> CommPrefs:
        return await self._get(_E["commprefs"], clientNumber=client_number)

    async def clientmemberships(self, client_number: str) -> list[ClientMembership]:
        return await self._get(_E["clientmemberships"], clientNumber=client_number)

    async def clientpackages(self, client_number: str) -> list[ClientPackage]:
        return await self._get(_E["clientpackages"], clientNumber=client_number)

    async def pointsbalance(self, client_number: str) -> list[PointsBalance]:
        return await self._get(_E["pointsbalance"], clientNumber=client_number)

    async def getpointstransactions(
        self, client_number: str, start_date: date | str, end_date: date | str
    ) -> list[PointsTransaction]:
        return await self._get(
            _E["getpointstransactions"], clientNumber=client_number, startDate=start_date, endDate=end_date
        )

    async def billinginfo(self, client_number: str) -> list[BillingAccount]:
        return await self._get(_E["billinginfo"], clientNumber=client_number)

    async def transactionhistory(
        self, client_number: str, start_date: date | str | None = None, end_date: date | str | None = None
    ) -> list[Transaction]:
        return await self._get(
            _E["transactionhistory"], clientNumber=client_number, startDate=start_date, endDate=end_date
        )

    async def affiliatedpackageclients(self, membership_id: str) -> list[AffiliatedClient]:
        return await self._get(_E["affiliatedpackageclients"], membershipId=membership_id)

    # -- client writes (keyword body fields, logical names) ----------------------------------------

    async def insert_client(self, **body: Unpack[InsertClientBody]) -> InsertClientAnswer:
        return await self._post(_E["insert_client"], body)

    async def update_demographics(self, **body: Unpack[UpdateDemographicsBody]) -> ClientAnswer:
        return await self._post(_E["update_demographics"], body)

    async def update_billing_info(self, **body: Unpack[UpdateBillingInfoBody]) -> BillingAccountAnswer:
        return await self._post(_E["update_billing_info"], body)

    async def insert_comment(self, **body: Unpack[InsertCommentBody]) -> CommentAnswer:
        return await self._post(_E["insert_comment"], body)

    async def insert_membership(self, **body: Unpack[InsertMembershipBody]) -> MembershipIdAnswer:
        return await self._post(_E["insert_membership"], body)

    async def insert_gift_cert(self, **body: Unpack[InsertGiftCertBody]) -> GiftCertAnswer:
        return await self._post(_E["insert_gift_cert"], body)

    async def freeze_membership(self, **body: Unpack[FreezeMembershipBody]) -> MembershipAnswer:
        return await self._post(_E["freeze_membership"], body)

    async def unfreeze_membership(self, **body: Unpack[MembershipBody]) -> MembershipAnswer:
        return await self._post(_E["unfreeze_membership"], body)

    async def activate_membership(self, **body: Unpack[MembershipBody]) -> MembershipAnswer:
        return await self._post(_E["activate_membership"], body)

    async def upgrade_membership(self, **body: Unpack[ChangeMembershipBody]) -> MembershipAnswer:
        return await self._post(_E["upgrade_membership"], body)

    async def downgrade_membership(self, **body: Unpack[ChangeMembershipBody]) -> MembershipAnswer:
        return await self._post(_E["downgrade_membership"], body)

    async def cancel_membership(self, **body: Unpack[CancelMembershipBody]) -> MembershipAnswer:
        return await self._post(_E["cancel_membership"], body)

    async def post_account_ledger_payment(
        self, **body: Unpack[PostAccountLedgerPaymentBody]
    ) -> BalanceAnswer:
        return await self._post(_E["post_account_ledger_payment"], body)

    async def insert_points(self, **body: Unpack[InsertPointsBody]) -> PointsAnswer:
        return await self._post(_E["insert_points"], body)

    async def update_comm_prefs(self, **body: Unpack[UpdateCommPrefsBody]) -> PreferencesAnswer:
        return await self._post(_E["update_comm_prefs"], body)

    async def insert_transaction(self, **body: Unpack[InsertTransactionBody]) -> ReceiptAnswer:
        return await self._post(_E["insert_transaction"], body)

    async def insert_payment(self, **body: Unpack[InsertPaymentBody]) -> PaymentAnswer:
        return await self._post(_E["insert_payment"], body)

    async def share_affiliated_package(self, **body: Unpack[AffiliatedPackageBody]) -> SharedClientsAnswer:
        return await self._post(_E["share_affiliated_package"], body)

    async def unshare_affiliated_package(self, **body: Unpack[AffiliatedPackageBody]) -> SharedClientsAnswer:
        return await self._post(_E["unshare_affiliated_package"], body)

    async def insert_profile_answers(self, **body: Unpack[InsertProfileAnswersBody]) -> CountAnswer:
        return await self._post(_E["insert_profile_answers"], body)

    async def add_referral(self, **body: Unpack[AddReferralBody]) -> ReferralAnswer:
        return await self._post(_E["add_referral"], body)

    async def generate_web_document(self, **body: Unpack[GenerateWebDocumentBody]) -> UrlAnswer:
        return await self._post(_E["generate_web_document"], body)

    # -- user writes -----------------------------------------------------------------------------

    async def register_user(self, **body: Unpack[RegisterUserBody]) -> RegisterAnswer:
        return await self._post(_E["register_user"], body)

    async def reset_password(self, **body: Unpack[ResetPasswordBody]) -> ResetAnswer:
        return await self._post(_E["reset_password"], body)

    async def login(self, **body: Unpack[LoginBody]) -> LoginAnswer:
        return await self._post(_E["login"], body)


def _secret_values(body: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(v) for k, v in body.items() if k in _SECRET_BODY_FIELDS and v not in (None, ""))
