"""The sandbox's HTTP server: every endpoint of the catalogue, on loopback, with aiohttp.web.

One catch-all handler dispatches by ``(method, path)`` from a dict built from
:data:`membersync.extract.catalogue.ENDPOINTS` (endpoints as data, not 49 routes). Each request
goes through, in order: HTTP Basic (401), the token bucket of its credential (429 with
``Retry-After``), the route (404 / 405), the configured latency, maybe an injected fault, then
the :class:`~membersync.extract.sandbox.state.Service` method named like the endpoint. The
tenant profile names the query parameters, wrapper keys and item fields on the wire (the
contract's by default, served without renaming); ``drift`` changes how values look (numbers as
strings, enumerations in other casing, unannounced fields).

Entry points: :func:`serve_forever` (``membersync sandbox``), :func:`start_in_thread` (tests,
demo, benchmarks).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import datetime as dt
import hmac
import logging
import math
import random
import time
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from membersync.extract import catalogue
from membersync.extract.profile import Profile
from membersync.extract.sandbox import days, population
from membersync.extract.sandbox.limits import Limiter, check_limits, limiter_for
from membersync.extract.sandbox.state import Service
from membersync.extract.sandbox.validation import ApiError, bad, parse_date, parse_utc
from membersync.extract.settings import SettingsError

log = logging.getLogger("membersync.sandbox")
JSON_TYPE = "application/json"
FAULT_KINDS = ("error_500", "unavailable_503", "html_502", "dropped", "truncated")
NESTED_RECORDS = catalogue.NESTED_RECORDS
ANSWER_RECORDS = catalogue.ANSWER_RECORDS
# Fields drift re-cases (enumerations compared case-insensitively by the contract).
DRIFT_ENUMS = frozenset(
    {"status", "type", "kind", "answerType", "role", "deductType", "gender", "category", "paymentType"}
)
HTML_502 = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"


# --- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SandboxConfig:
    """How the sandbox behaves. Defaults: the contract, no limits, no faults."""

    clients: int = 1000
    stores: int = 5
    seed: int = 42
    rate: float = 0.0  # requests/s per credential (token bucket), 0 = unlimited
    latency_ms: float = 0.0
    fault_rate: float = 0.0  # share of requests answered with an injected fault
    username: str = "sandbox"
    password: str = field(default="sandbox", repr=False)
    anchor_date: dt.date | None = None  # data is generated up to it; default today (UTC)
    drift: bool = False  # numbers as strings, enumerations in other casing, extra fields
    profile: Profile | None = None  # serve a tenant's wire names (default: the contract)
    burst: float | None = None  # token-bucket capacity (default: rate, at least 1)
    lazy: bool = False  # fill clients' holdings on first use (fast start-up; see state.Service)
    announce_limits: bool = False  # RateLimit-* headers (IETF draft) on every answer, when rate > 0
    # A fixed window instead of the token bucket: rate x window requests per window of this many
    # seconds, counted from its first request; beyond them 429 until it ends (0: a token bucket)
    window: float = 0.0
    max_in_flight: int = 0  # 429 when more than this many of a credential's requests are open (0: no cap)
    # the last days before the anchor are business days (sales, payments, freezes: sandbox/days.py),
    # so the data reaches the night before the anchor (0: generated activity ends days earlier)
    recent_days: int = 0

    @classmethod
    def checked(cls, **kw: Any) -> SandboxConfig:
        """A config from keyword values, or :class:`SettingsError` with one line naming the value."""
        unknown = sorted(set(kw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise SettingsError(f"unknown sandbox setting {unknown[0]!r}")
        config = cls(**kw)
        if not isinstance(config.clients, int) or config.clients < 1:
            raise SettingsError("sandbox clients must be a whole number >= 1")
        if not isinstance(config.stores, int) or not 1 <= config.stores <= 999:
            raise SettingsError("sandbox stores must be between 1 and 999")
        if not (math.isfinite(config.rate) and config.rate >= 0):
            raise SettingsError("sandbox rate must be >= 0 requests/s (0 = unlimited)")
        if config.burst is not None and not (math.isfinite(config.burst) and config.burst >= 1):
            raise SettingsError("sandbox burst must be >= 1 request")
        if not (math.isfinite(config.latency_ms) and config.latency_ms >= 0):
            raise SettingsError("sandbox latency must be >= 0 ms")
        check_limits(config.rate, config.burst, config.window, config.max_in_flight)
        if not 0.0 <= config.fault_rate <= 1.0:
            raise SettingsError("sandbox fault rate must be between 0 and 1")
        if not config.username or ":" in config.username:
            raise SettingsError("sandbox username must be non-empty and must not contain ':'")
        if not config.password:
            raise SettingsError("sandbox password must not be empty")
        if not isinstance(config.recent_days, int) or not 0 <= config.recent_days <= 400:
            raise SettingsError("sandbox recent days must be between 0 and 400")
        if config.anchor_date is not None and not isinstance(config.anchor_date, dt.date):
            raise SettingsError("sandbox anchor date must be a date")
        return config

    @property
    def anchor(self) -> dt.date:
        return self.anchor_date or dt.datetime.now(dt.UTC).date()

    def describe(self) -> str:
        """One line for logs: every setting but the credentials (Basic user and password)."""
        rate = f"{self.rate:g}/s burst {self.burst or max(1.0, self.rate):g}" if self.rate else "unlimited"
        if self.rate and self.window:
            rate = f"{self.rate:g}/s in {self.window:g}-s windows"
        profile = self.profile.source if self.profile else "contract"
        return (
            f"clients={self.clients} stores={self.stores} seed={self.seed} anchor={self.anchor} "
            f"rate={rate} latency_ms={self.latency_ms:g} fault_rate={self.fault_rate:g} "
            f"drift={self.drift} profile={profile} lazy={self.lazy} announce_limits={self.announce_limits} "
            f"recent_days={self.recent_days} max_in_flight={self.max_in_flight}"
        )


@dataclass
class SandboxStats:
    """What the server did (read from tests; written only on the server's loop)."""

    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_endpoint: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)  # by kind, + "write_applied"
    rate_limited: int = 0
    over_in_flight: int = 0  # of the 429s: more than max_in_flight open at once
    peak_in_flight: int = 0  # the most of one credential's requests open at once
    unauthorized: int = 0
    # Answers per second of the server's monotonic clock, for measuring a client's pace at the
    # server: requests let through the token bucket, and requests refused with a 429.
    passed_per_second: Counter[int] = field(default_factory=Counter)
    refused_per_second: Counter[int] = field(default_factory=Counter)
    # How late the server's loop woke, per second (the worst of a LOOP_TICK timer, only seconds
    # with a wake-up over LOOP_LATE_NOTED): the counts above are taken when a request is
    # handled, so a loop held back (a busy machine, a busy process) meets the requests sent
    # meanwhile at once, and its bucket refuses them however evenly they were sent.
    loop_late_per_second: dict[int, float] = field(default_factory=dict)

    @property
    def faults_injected(self) -> int:
        return sum(n for kind, n in self.faults.items() if kind in FAULT_KINDS)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_status": dict(self.by_status),
            "by_endpoint": dict(self.by_endpoint),
            "faults": dict(self.faults),
            "faults_injected": self.faults_injected,
            "rate_limited": self.rate_limited,
            "over_in_flight": self.over_in_flight,
            "peak_in_flight": self.peak_in_flight,
            "unauthorized": self.unauthorized,
            "passed_per_second": dict(self.passed_per_second),
            "refused_per_second": dict(self.refused_per_second),
            "loop_late_per_second": dict(self.loop_late_per_second),
        }


STATS_PATH = "/_sandbox/stats"
LOOP_TICK = 0.05  # seconds between the loop watch's wake-ups (an idle sandbox: 0.5 % of a core)
LOOP_LATE_NOTED = 0.01  # seconds late: a wake-up later than this is noted in the stats


def build_service(config: SandboxConfig) -> Service:
    profile = config.profile or Profile.default()
    started = time.perf_counter()
    start = config.anchor - dt.timedelta(days=config.recent_days)  # generated up to it, then days of business
    service = population.generate(
        config.seed, config.clients, config.stores, start, max_page_size=profile.max_page_size
    )
    if config.recent_days:
        days.run_days(service, start, config.anchor - dt.timedelta(days=1), config.seed)
        days.resume_real_time(service, config.anchor)
    if not config.lazy:
        service.materialize_all()
    log.info("sandbox data ready in %.1fs (%d clients)", time.perf_counter() - started, config.clients)
    return service


# --- routing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ParamSpec:
    logical: str
    wire: str
    kind: str
    required: bool
    arg: str  # the Service method's argument (snake_case)


@dataclass(frozen=True, slots=True)
class _Route:
    endpoint: catalogue.Endpoint
    params: tuple[_ParamSpec, ...]


def _snake(name: str) -> str:
    return "".join(f"_{ch.lower()}" if ch.isupper() else ch for ch in name)


class SandboxServer:
    """The request handler and everything it needs (one per sandbox)."""

    def __init__(self, config: SandboxConfig, service: Service | None = None) -> None:
        self.config = config
        self.service = service if service is not None else build_service(config)
        self.profile = config.profile or Profile.default()
        self.contract = self.profile.is_contract
        self.stats = SandboxStats()
        self.routes: dict[tuple[str, str], _Route] = {}
        self.methods: dict[str, list[str]] = {}
        for ep in catalogue.ENDPOINTS:
            params = tuple(
                _ParamSpec(p.name, self.profile.param(p.name), p.kind, p.required, _snake(p.name))
                for p in ep.params
            )
            self.routes[(ep.method, ep.path)] = _Route(ep, params)
            self.methods.setdefault(ep.path, []).append(ep.method)
        self._accept_credentials(config.username, config.password)
        self._buckets: dict[str, Limiter] = {}
        self._open: Counter[str] = Counter()  # requests open per credential (max_in_flight)
        self._burst = config.burst or max(1.0, config.rate)
        self._faults = random.Random(config.seed ^ 0x5EED)
        self._watch: asyncio.Task[None] | None = None

    # --- the loop watch -----------------------------------------------------------------------

    def start_watch(self) -> None:
        """Note in the stats how late the server's loop wakes (on the running loop)."""
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    async def stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None

    async def _watch_loop(self) -> None:
        late_per_second = self.stats.loop_late_per_second
        while True:
            due = time.monotonic() + LOOP_TICK
            await asyncio.sleep(LOOP_TICK)
            now = time.monotonic()
            late = now - due
            if late > LOOP_LATE_NOTED:
                second = int(now)
                late_per_second[second] = max(late, late_per_second.get(second, 0.0))

    # --- the handler --------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        stats = self.stats
        if request.path == STATS_PATH:  # the sandbox's own figures, for benchmarks (no auth: loopback)
            body = orjson.dumps(stats.as_dict(), option=orjson.OPT_NON_STR_KEYS)
            return web.Response(body=body, content_type=JSON_TYPE)
        stats.requests += 1
        user = self._authorized(request.headers.get("Authorization"))
        if user is None:
            stats.unauthorized += 1
            return self._error(
                ApiError(401, "unauthorized", "missing or wrong Basic credentials"),
                {"WWW-Authenticate": 'Basic realm="svcapi"'},
            )
        cap = self.config.max_in_flight
        if not cap:
            return await self._limited(request, user)
        open_now = self._open[user]
        if open_now >= cap:  # the cap is checked first: a request it refuses takes no token
            return self._over_in_flight(cap)
        self._open[user] = open_now + 1
        stats.peak_in_flight = max(stats.peak_in_flight, open_now + 1)
        try:
            return await self._limited(request, user)
        finally:
            self._open[user] -= 1

    def _over_in_flight(self, cap: int) -> web.Response:
        stats = self.stats
        stats.refused_per_second[int(time.monotonic())] += 1
        stats.rate_limited += 1
        stats.over_in_flight += 1
        error = ApiError(429, "rate_limited", f"too many requests in flight: at most {cap} at once")
        return self._error(error, {"Retry-After": "1"})

    async def _limited(self, request: web.BaseRequest, user: str) -> web.StreamResponse:
        """The request past the credentials (and the cap): the rate, the route, the answer."""
        stats = self.stats
        limit_headers, refusal = self._rate_limit(user)
        if refusal is not None:
            return refusal
        route = self.routes.get((request.method, request.path))
        if route is None:
            return self._unrouted(request)
        stats.by_endpoint[route.endpoint.name] += 1
        if self.config.latency_ms:
            await asyncio.sleep(self.config.latency_ms / 1000)
        fault = None
        if self.config.fault_rate and self._faults.random() < self.config.fault_rate:
            fault = self._faults.choice(FAULT_KINDS)
        try:
            if fault is not None and fault != "truncated":
                return await self._fault(request, route, fault)
            body = await self._answer(request, route)
        except ApiError as exc:
            if fault == "truncated":  # only a 200 is truncated: a refusal becomes a 500 instead
                stats.faults["error_500"] += 1
                return self._error(ApiError(500, "internal_error", "an internal error occurred"))
            return self._error(exc)
        if fault == "truncated":
            stats.faults[fault] += 1
            body = body[: max(1, len(body) // 2)]
        stats.by_status[200] += 1
        return web.Response(body=body, content_type=JSON_TYPE, headers=limit_headers)

    def _rate_limit(self, user: str) -> tuple[dict[str, str] | None, web.Response | None]:
        """The user's bucket takes this request: its headers (when announced), and a 429 if empty."""
        stats = self.stats
        if self.config.rate <= 0:
            stats.passed_per_second[int(time.monotonic())] += 1  # (a cap's pace, measured at the server)
            return None, None
        bucket = self._bucket(user)
        wait = bucket.take()
        limit_headers = bucket.announce() if self.config.announce_limits else None
        second = int(time.monotonic())
        if wait <= 0:
            stats.passed_per_second[second] += 1
            return limit_headers, None
        stats.refused_per_second[second] += 1
        stats.rate_limited += 1
        retry = str(max(1, math.ceil(wait)))
        refusal = self._error(
            ApiError(429, "rate_limited", f"rate limit exceeded: retry after {retry}s"),
            {"Retry-After": retry, **(limit_headers or {})},
        )
        return limit_headers, refusal

    def _unrouted(self, request: web.BaseRequest) -> web.Response:
        allowed = self.methods.get(request.path)
        if allowed:
            return self._error(
                ApiError(405, "method_not_allowed", f"{request.method} not allowed on {request.path}"),
                {"Allow": ", ".join(allowed)},
            )
        return self._error(ApiError(404, "not_found", f"no endpoint {request.path}"))

    async def _answer(self, request: web.BaseRequest, route: _Route) -> bytes:
        ep = route.endpoint
        if ep.method == "GET":
            client = (ep.name, request.query.get(self.profile.param("clientNumber"), ""))
            refusal = self.service.tenant_refusals.get(client)
            if refusal is not None:
                raise ApiError(*refusal)
            result = self._run_get(route, request.query)
            added = self.service.tenant_fields.get(client)
            if added:
                result = _with_fields(result, added)
        else:
            raw = await request.read()
            result = self._run_post(ep, raw)
        return orjson.dumps(self._wire(ep, result))

    def _run_get(self, route: _Route, query: Mapping[str, str]) -> Any:
        ep = route.endpoint
        kwargs: dict[str, Any] = {}
        for spec in route.params:
            raw = query.get(spec.wire)
            if raw is None or raw == "":
                if spec.required:
                    raise bad("missing_parameter", f"{spec.wire} is required")
                continue
            if spec.kind == "date":
                kwargs[spec.arg] = parse_date(raw, spec.wire)
            elif spec.kind == "datetime":
                kwargs[spec.arg] = parse_utc(raw, spec.wire)
            elif spec.kind == "int":
                try:
                    kwargs[spec.arg] = int(raw)
                except ValueError:
                    raise bad("invalid_value", f"{spec.wire} must be a whole number") from None
            else:
                kwargs[spec.arg] = raw
        if ep.kind == "search":
            return self._search(kwargs)
        return getattr(self.service, ep.name)(**kwargs)

    def _search(self, kwargs: dict[str, Any]) -> Any:
        first = self.profile.first_page
        page = kwargs.pop("page", first)
        size = kwargs.pop("page_size", catalogue.DEFAULT_PAGE_SIZE)
        if page < first:
            raise bad("invalid_page", f"{self.profile.param('page')} must be {first} or more")
        if not 1 <= size <= self.profile.max_page_size:
            raise bad(
                "invalid_page_size",
                f"{self.profile.param('pageSize')} must be between 1 and {self.profile.max_page_size}",
            )
        result = self.service.search(page=page - first + 1, page_size=size, **kwargs)
        result["page"] = page
        return result

    def _run_post(self, ep: catalogue.Endpoint, raw: bytes) -> Any:
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            raise bad("invalid_json", "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise bad("invalid_body", "the request body must be a JSON object")
        if not self.contract:
            body = self.profile.to_logical(ep.name, body)
        return getattr(self.service, ep.name)(body)

    # --- faults ---------------------------------------------------------------------------------

    async def _fault(self, request: web.BaseRequest, route: _Route, kind: str) -> web.StreamResponse:
        """Answer with an injected fault; a write is sometimes applied first (as a real server might)."""
        stats = self.stats
        stats.faults[kind] += 1
        if route.endpoint.is_write and self._faults.random() < 0.5:
            try:
                await self._answer(request, route)
                stats.faults["write_applied"] += 1
            except ApiError:
                pass
        if kind == "dropped":
            transport = request.transport
            if transport is not None:
                transport.close()
            raise asyncio.CancelledError  # aiohttp drops the half-served connection quietly
        if kind == "html_502":
            stats.by_status[502] += 1
            return web.Response(status=502, body=HTML_502, content_type="text/html")
        if kind == "unavailable_503":
            return self._error(
                ApiError(503, "unavailable", "the service is unavailable"), {"Retry-After": "1"}
            )
        return self._error(ApiError(500, "internal_error", "an internal error occurred"))

    # --- rendering ------------------------------------------------------------------------------

    def _wire(self, ep: catalogue.Endpoint, result: Any) -> Any:
        """The logical answer in the tenant's wire shape (wrapper, names, drift)."""
        drift = self.config.drift
        if ep.kind == "search":
            items = result["clients"]
            if drift:
                items = _drift(items)
            if not self.contract:
                items = [self.profile.to_wire("clientSummary", it) for it in items]
            wire: dict[str, Any] = {
                self.profile.wrapper(ep) or "clients": items,
                self.profile.param("page"): result["page"],
                self.profile.param("pageSize"): result["pageSize"],
                self.profile.total_key: result["totalCount"],
            }
            return _drift(wire, top=True) if drift else wire
        if ep.is_write:
            answer = _drift(result) if drift else result
            if not self.contract:
                answer = self._rename_answer(ep.name, answer)
            return answer
        if drift:
            result = _drift(result)
        if not self.contract and ep.record:
            result = (
                [self._rename(ep.record, it) for it in result]
                if isinstance(result, list)
                else self._rename(ep.record, result)
            )
        wire = {self.profile.wrapper(ep) or ep.wrapper or "items": result}
        return _drift(wire, top=True) if drift else wire

    def _rename(self, record: str, item: dict[str, Any]) -> dict[str, Any]:
        nested = NESTED_RECORDS.get(record)
        if nested:
            item = dict(item)
            for key, sub in nested.items():
                if isinstance(item.get(key), list):
                    item[key] = [self.profile.to_wire(sub, x) for x in item[key]]
        return self.profile.to_wire(record, item)

    def _rename_answer(self, name: str, answer: dict[str, Any]) -> dict[str, Any]:
        answer = dict(answer)
        for key, record in ANSWER_RECORDS.items():
            value = answer.get(key)
            if isinstance(value, dict):
                answer[key] = self.profile.to_wire(record, value)
            elif isinstance(value, list):
                answer[key] = [self.profile.to_wire(record, x) for x in value]
        return self.profile.to_wire(name, answer)

    def _error(self, exc: ApiError, headers: dict[str, str] | None = None) -> web.Response:
        self.stats.by_status[exc.status] += 1
        return web.Response(
            status=exc.status, body=orjson.dumps(exc.body()), content_type=JSON_TYPE, headers=headers
        )

    # --- auth and rate ----------------------------------------------------------------------------

    def _authorized(self, header: str | None) -> str | None:
        """The username when the Basic credentials are right (constant-time compare), else None."""
        if not header:
            return None
        raw = header.encode("utf-8", "surrogateescape")
        if hmac.compare_digest(raw, self._expected_header):
            return self.config.username
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = decoded.partition(b":")
        user_ok = hmac.compare_digest(user, self._username)
        password_ok = hmac.compare_digest(password, self._password)
        return self.config.username if sep and user_ok and password_ok else None

    def change_password(self, password: str) -> None:
        """The vendor's account gets a new password (an administrator rotated it): from the next
        request on, the old one is refused with 401, as a night that began with it would see."""
        if not password:
            raise SettingsError("sandbox password must not be empty")
        self._accept_credentials(self.config.username, password)

    def _accept_credentials(self, username: str, password: str) -> None:
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self._expected_header = f"Basic {token}".encode()
        self._username = username.encode()
        self._password = password.encode()

    def _bucket(self, user: str) -> Limiter:
        bucket = self._buckets.get(user)
        if bucket is None:
            config = self.config
            bucket = self._buckets[user] = limiter_for(config.rate, self._burst, config.window)
        return bucket


def _recase(value: str, salt: int) -> str:
    """Another casing of ``value``, varying from record to record (``salt``): both sides of a
    case-insensitive comparison see every spelling, not one per value."""
    variant = zlib.crc32(value.encode(), salt) % 4
    return (value.upper(), value.lower(), value.swapcase(), value.title())[variant]


def _with_fields(result: Any, fields: dict[str, Any]) -> Any:
    """Each item of an answer with a tenant's own fields added (Service.tenant_fields)."""
    if isinstance(result, list):
        return [{**item, **fields} if isinstance(item, dict) else item for item in result]
    return {**result, **fields} if isinstance(result, dict) else result


def _drift(value: Any, top: bool = False) -> Any:
    """Numbers as strings, enumerations in other casing, unannounced fields on every object."""
    if isinstance(value, list):
        return [_drift(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    # A record's casing follows its first field (its id, mostly): the same record is spelled
    # the same way on every fetch (the self-audit compares two), others differently.
    salt = zlib.crc32(repr(next(iter(value.values()), None)).encode())
    for key, v in value.items():
        if isinstance(v, bool) or v is None:
            out[key] = v
        elif isinstance(v, int | float):
            out[key] = str(v)
        elif isinstance(v, str) and key in DRIFT_ENUMS:
            out[key] = _recase(v, salt)
        elif isinstance(v, dict | list):
            out[key] = _drift(v)
        else:
            out[key] = v
    out["rowVersion"] = str(len(value))
    if top:
        out["serverNode"] = "node-7"
    else:
        out["legacyCode"] = f"L{len(value) * 37 % 997:03d}"
    return out
