"""Typing wire records into Arrow: one declared schema per landed table, bad rows quarantined.

The client hands over items exactly as received (logical field names, untyped values). This
module types them into the Arrow schema that :mod:`membersync.models.tables` declares:

* **Allowlist.** Only declared columns land as columns; any other field goes into the row's
  ``extra`` JSON column. Secrets (:data:`SECRET_FIELDS`) are never columns, and they are
  scrubbed, at any depth, from ``extra`` and from quarantined raw JSON.
* **Exact.** Money becomes ``decimal128(18, 2)`` through its decimal text (``repr`` of a float,
  the string itself), never through binary float arithmetic; ids stay strings byte for byte.
* **Never a crash.** A row that cannot be typed (wrong type, missing key, money with more
  than 2 decimals, a number out of range, an unparsable date, not an object) is quarantined:
  kept raw as JSON with the reason and its table name. Only a caller's bug (a context value the
  table needs but the caller did not pass) raises.
* **Cheap.** Each cell is checked by one small Python function; Arrow arrays are then built
  column-wise in one call per column. :class:`BatchBuilder` accumulates many requests (one
  client's memberships, the next client's ...) and builds Arrow once per batch, so the fixed
  cost of building Arrow arrays is not paid per HTTP request.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import orjson
import pyarrow as pa
from membersync.extract.catalogue import PERSONAL_EXTRA_FIELDS
from membersync.models.tables import (
    ARROW_TYPES,
    MONEY,
    SECRET_FIELDS,
    TYPED_QUARANTINE_SCHEMA,
    ColumnKind,
    Table,
)
from membersync.models.tables import table as table_named

log = logging.getLogger(__name__)

UTC = dt.UTC
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_CENTS = 10**18 - 1  # decimal(18, 2): 16 digits before the point, 2 after
FLOAT_EXACT = 1e13  # money as a JSON number is exact below this (15 significant digits)

# Secrets are matched loosely when scrubbing extra / raw JSON (a tenant may spell them
# ``api_key`` or ``Password``): lower case, separators removed.
_SECRET_KEYS = frozenset(s.lower() for s in SECRET_FIELDS)


def _is_secret(key: object) -> bool:
    return isinstance(key, str) and key.lower().replace("_", "").replace("-", "") in _SECRET_KEYS


# --- timezones --------------------------------------------------------------------------------


class TimezoneLookup:
    """Store -> IANA timezone, from the storelist's ``timezone``. Unknown store (or zone) -> UTC."""

    def __init__(self, zones: Mapping[str, str] | None = None) -> None:
        self._zones: dict[str, dt.tzinfo] = {}
        for storecode, name in (zones or {}).items():
            self._zones[storecode] = _zone(name, storecode)

    @classmethod
    def from_stores(cls, stores: Iterable[Any]) -> TimezoneLookup:
        """From storelist items (``storecode``, ``timezone``); malformed items are skipped."""
        zones: dict[str, str] = {}
        for item in stores:
            if isinstance(item, dict):
                code, name = item.get("storecode"), item.get("timezone")
                if isinstance(code, str) and isinstance(name, str):
                    zones[code] = name
        return cls(zones)

    def zone(self, storecode: object) -> dt.tzinfo:
        if isinstance(storecode, str):
            return self._zones.get(storecode, UTC)
        return UTC

    def to_local(self, instant: dt.datetime, storecode: object) -> dt.datetime:
        """An aware datetime as the store's naive local wall-clock time."""
        return instant.astimezone(self.zone(storecode)).replace(tzinfo=None)


def _zone(name: object, storecode: str) -> dt.tzinfo:
    try:
        return ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        log.warning("store %r: unknown timezone %r, using UTC", storecode, name)
        return UTC


_UTC_ONLY = TimezoneLookup()


# --- cell converters: wire value -> Python value for pa.array, or _Bad ----------------------------


class _Bad(Exception):
    """One cell cannot be typed; the message is the (secret-free) reason."""


def _show(value: object) -> str:
    """A bad value as a reason names it: its length, never its text (a value in the wrong field
    may be anyone's name or number; the quarantined row's raw JSON keeps it, masked)."""
    return f"({len(repr(value))} characters)"


def _wrong(value: object, expected: str) -> _Bad:
    return _Bad(f"expected {expected}, got {type(value).__name__} {_show(value)}")


def _string(value: object) -> str:
    if type(value) is not str:
        raise _wrong(value, "a string")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _Bad("string is not valid unicode (lone surrogate)") from None
    return value


_INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}", re.ASCII)


def _int(value: object) -> int:
    if type(value) is int:
        number = value
    elif (type(value) is float and value.is_integer()) or (type(value) is str and _INT_TEXT.fullmatch(value)):
        number = int(value)
    else:
        raise _wrong(value, "an integer")
    if not INT64_MIN <= number <= INT64_MAX:
        raise _Bad(f"integer out of int64 range: {_show(value)}")
    return number


def _cents(value: object) -> int:
    """Money as integer cents, exactly: from its decimal text, never from float arithmetic."""
    if type(value) is int:
        cents = value * 100
    elif type(value) is float:
        if not -FLOAT_EXACT < value < FLOAT_EXACT:  # rare: only here do we pay for the checks
            _check_large_float(value)
        cents = _cents_of_text(repr(value), value)  # repr: the shortest text that round-trips
    elif type(value) is str:
        cents = _cents_of_text(value, value)
    else:
        raise _wrong(value, "money (a number or numeric string)")
    if not -MAX_CENTS <= cents <= MAX_CENTS:
        raise _Bad(f"money out of decimal(18,2) range: {_show(value)}")
    return cents


def _check_large_float(value: float) -> None:
    if value != value or value in (float("inf"), float("-inf")):
        raise _Bad(f"money is not a finite number: {_show(value)}")
    if abs(value) >= 1e16:
        raise _Bad(f"money out of decimal(18,2) range: {_show(value)}")
    if not (value.is_integer() and abs(value) <= 2**53):
        # A double keeps 15 significant digits: beyond, the JSON text was already rounded.
        raise _Bad(f"money too large to be exact as a JSON number (send a string): {_show(value)}")


def _cents_of_text(text: str, value: object) -> int:
    """``[+-]digits[.digits]`` (ASCII digits only) as cents; the sign stays in the text."""
    if text.isascii() and len(text) <= 40:
        whole, _, frac = text.partition(".")
        digits = whole[1:] if whole[:1] in ("+", "-") else whole
        if (digits.isdigit() or (not digits and frac.isdigit())) and (not frac or frac.isdigit()):
            if len(frac) > 2:
                if frac[2:].strip("0"):
                    raise _Bad(f"money with more than 2 decimals: {_show(value)}")
                frac = frac[:2]
            return int(whole + frac.ljust(2, "0"))  # "-0" + "50" -> -50: the sign survives
    if type(value) is float:  # repr gave an exponent ("1e+16", "5e-05") or nan / inf
        return _cents_of_decimal(text, value)
    raise _wrong(value, "money (a number or numeric string)")


def _cents_of_decimal(text: str, value: object) -> int:
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise _wrong(value, "money") from None
    if not number.is_finite():
        raise _Bad(f"money is not a finite number: {_show(value)}")
    if number.adjusted() > 17:
        raise _Bad(f"money out of decimal(18,2) range: {_show(value)}")
    cents = number.scaleb(2)
    if cents != cents.to_integral_value():
        raise _Bad(f"money with more than 2 decimals: {_show(value)}")
    return int(cents)


def _bool(value: object) -> bool:
    if type(value) is bool:
        return value
    if type(value) is str and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _wrong(value, "a boolean")


_DATE_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)
_DATETIME_TEXT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}"  # a plain date is midnight
    r"(?:[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?(?:Z|[+-][0-9]{2}:[0-9]{2})?)?",
    re.ASCII,
)


def _date(value: object) -> dt.date:
    if type(value) is str and _DATE_TEXT.fullmatch(value):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise _wrong(value, "a date YYYY-MM-DD")


def _datetime(value: object) -> dt.datetime:
    """Naive (no offset in the text) or aware datetime; a plain date is midnight."""
    if type(value) is str and _DATETIME_TEXT.fullmatch(value):
        try:
            if len(value) == 10:
                return dt.datetime.combine(dt.date.fromisoformat(value), dt.time())
            return dt.datetime.fromisoformat(value)
        except ValueError:
            pass
    raise _wrong(value, "a datetime YYYY-MM-DDTHH:MM:SS")


def _utc(value: object) -> dt.datetime:
    """A UTC instant (aware, in UTC); a missing ``Z`` is read as UTC (lastModified is UTC)."""
    moment = _datetime(value)
    if moment.tzinfo is None or moment.tzinfo is UTC:
        return moment
    try:
        return moment.astimezone(UTC)  # in Python, so an instant outside years 1..9999 is refused
    except OverflowError:
        raise _Bad(f"datetime out of range: {_show(value)}") from None


def _text_list(value: object) -> list[str]:
    if type(value) is not list:
        raise _wrong(value, "an array of strings")
    return [_string(v) for v in value]


_CONVERTERS: dict[ColumnKind, Callable[[Any], Any]] = {
    "id": _string,
    "text": _string,
    "enum": _string,  # verbatim: unknown values are kept, compared case-insensitively later
    "money": _cents,
    "int": _int,
    "bool": _bool,
    "date": _date,
    "local_ts": _datetime,  # an offset is resolved per row against the store's timezone
    "utc_ts": _utc,
    "text_list": _text_list,
}


# --- column builders: Python values -> Arrow array ----------------------------------------------


def _money_array(cents: list[int | None]) -> pa.Array:
    """decimal128(18, 2) straight from integer cents (two's complement, 128-bit little endian)."""
    ints = pa.array(cents, pa.int64())
    validity, data = ints.buffers()
    low = np.frombuffer(data, dtype=np.int64, count=len(ints)) if len(ints) else np.empty(0, np.int64)
    wide = np.empty((len(ints), 2), dtype=np.int64)
    wide[:, 0] = low
    wide[:, 1] = low >> 63  # sign extension
    return pa.Array.from_buffers(MONEY, len(ints), [validity, pa.py_buffer(wide)], null_count=ints.null_count)


def _array(kind: ColumnKind, values: list[Any]) -> pa.Array:
    if kind == "money":
        return _money_array(values)
    return pa.array(values, ARROW_TYPES[kind])


# --- JSON for extra / raw ----------------------------------------------------------------------


def scrub(value: Any) -> Any:
    """A copy of a JSON-shaped value without secret keys, at any depth."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if not _is_secret(k)}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


def to_json(value: Any) -> str:
    """Secret-free JSON text of any value; never raises (falls back to a description)."""
    try:
        clean = scrub(value)
    except RecursionError:
        return json.dumps({"_unserializable": "nested too deeply"})
    try:
        return orjson.dumps(clean, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        pass  # ints beyond 64 bits, lone surrogates, non-string keys, very deep nesting
    for sort_keys in (True, False):
        try:
            return json.dumps(clean, sort_keys=sort_keys, ensure_ascii=True, default=repr)
        except (TypeError, ValueError, RecursionError):
            continue
    return json.dumps({"_unserializable": type(value).__name__})


# --- results -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuarantineRow:
    table_name: str
    client_number: str | None
    reason: str
    raw: str  # JSON of the item, secrets removed


@dataclass(frozen=True, slots=True)
class Landed:
    table: pa.Table
    quarantine: list[QuarantineRow] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.table.num_rows


def quarantine_table(rows: Iterable[QuarantineRow]) -> pa.Table:
    rows = list(rows)
    return pa.Table.from_arrays(
        [
            pa.array([r.table_name for r in rows], pa.string()),
            pa.array([r.client_number for r in rows], pa.string()),
            pa.array([r.reason for r in rows], pa.string()),
            pa.array([r.raw for r in rows], pa.string()),
        ],
        schema=TYPED_QUARANTINE_SCHEMA,
    )


# --- the typing plan of a table --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    table: Table
    # name, source, where (_ITEM / _CONTEXT / _EITHER), converter, nullable, plain string kind
    fields: tuple[tuple[str, str, str, Callable[[Any], Any], bool, bool], ...]
    local_ts: tuple[int, ...]  # positions of store-local datetimes
    context_keys: frozenset[str]  # "@..." keys the caller must pass
    sources: frozenset[str]  # item fields that are columns (or handled), so not extra
    kinds: tuple[ColumnKind, ...]
    schema: pa.Schema
    personal_extra: frozenset[str]  # names never kept in extra (personal; see models.privacy)

    @classmethod
    def of(cls, table: Table, handled: frozenset[str] = frozenset()) -> _Plan:
        fields = tuple(
            (
                c.name,
                c.source,
                _where(c.source),
                _CONVERTERS[c.kind],
                c.nullable,
                c.kind in ("id", "text", "enum"),
            )
            for c in table.columns
        )
        return cls(
            table=table,
            fields=fields,
            local_ts=tuple(i for i, c in enumerate(table.columns) if c.kind == "local_ts"),
            context_keys=frozenset(c.source for c in table.columns if c.source.startswith("@")),
            sources=frozenset(c.source for c in table.columns if not c.source.startswith("@")) | handled,
            kinds=tuple(c.kind for c in table.columns),
            schema=table.schema,
            # A record about a person keeps its whole extra (it lands in the identity table);
            # any other record drops the names that are personal wherever they appear.
            personal_extra=frozenset() if table.describes_a_person else PERSONAL_EXTRA_FIELDS,
        )


_ITEM, _CONTEXT, _EITHER = "item", "context", "either"
# Item fields that the request's context also knows (a membership item has no clientNumber).
CONTEXT_FALLBACK = frozenset({"clientNumber"})


def _where(source: str) -> str:
    if source.startswith("@"):
        return _CONTEXT
    return _EITHER if source in CONTEXT_FALLBACK else _ITEM


_PLANS: dict[tuple[str, frozenset[str]], _Plan] = {}


def _plan(table: Table, handled: frozenset[str] = frozenset()) -> _Plan:
    key = (table.name, handled)
    plan = _PLANS.get(key)
    if plan is None or plan.table is not table:
        plan = _PLANS[key] = _Plan.of(table, handled)
    return plan


# --- the builder ---------------------------------------------------------------------------------


class _Rows:
    """Typed rows of one table (each a list: column values, then extra), plus its quarantine."""

    __slots__ = ("data", "plan", "quarantine")

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.data: list[list[Any]] = []
        self.quarantine: list[QuarantineRow] = []

    def to_landed(self) -> Landed:
        plan = self.plan
        # Transpose once (C speed), then one pa.array per column.
        columns = list(zip(*self.data, strict=True)) if self.data else [()] * (len(plan.kinds) + 1)
        arrays = [_array(kind, list(values)) for kind, values in zip(plan.kinds, columns, strict=False)]
        arrays.append(pa.array(list(columns[-1]), pa.string()))
        return Landed(pa.Table.from_arrays(arrays, schema=plan.schema), list(self.quarantine))


def _client_of(item: object, context: Mapping[str, Any]) -> str | None:
    number = context.get("clientNumber")
    if isinstance(number, str):
        return number
    if isinstance(item, dict):
        number = item.get("clientNumber")
        if type(number) is str and number.isascii():
            return number
    return None


class BatchBuilder:
    """Accumulate typed rows of many requests; build Arrow once per batch.

    ``add`` types one request's items (cheap, per row), ``build`` makes the Arrow tables (one
    ``pa.array`` per column). :func:`to_arrow` is ``add`` + ``build`` for a single request.
    """

    def __init__(self, tz: TimezoneLookup | None = None) -> None:
        self.tz = tz or _UTC_ONLY
        self._rows: dict[str, _Rows] = {}

    def _rows_of(self, plan: _Plan) -> _Rows:
        rows = self._rows.get(plan.table.name)
        if rows is None:
            rows = self._rows[plan.table.name] = _Rows(plan)
        return rows

    def add(self, table: Table | str, items: Iterable[Any], context: Mapping[str, Any]) -> int:
        """Type one request's items into ``table``; returns the number of rows accepted."""
        table = table_named(table) if isinstance(table, str) else table
        plan = _plan(table)
        _check_context(plan, context)
        rows = self._rows_of(plan)
        accepted = 0
        for item in _iterate(items):
            typed = self._type_row(plan, item, context)
            if isinstance(typed, str):
                rows.quarantine.append(_quarantined(table.name, item, context, typed))
            else:
                _append(rows, typed)
                accepted += 1
        return accepted

    def add_transactions(self, items: Iterable[Any], client_number: str) -> int:
        """Explode transaction history into transactions, lines and payments (see module doc).

        A receipt lands whole or not at all: if the transaction or any of its lines or payments
        cannot be typed, the whole receipt is quarantined (under ``transactions``, the reason
        names the part), so revenue is never counted from half a receipt.
        """
        plans = (
            _plan(table_named("transactions"), frozenset({"lines", "payments"})),
            _plan(table_named("transaction_lines")),
            _plan(table_named("transaction_payments")),
        )
        context = {"clientNumber": client_number}
        accepted = 0
        for item in _iterate(items):
            typed = self._type_receipt(plans, item, context)
            if isinstance(typed, str):
                self._rows_of(plans[0]).quarantine.append(_quarantined("transactions", item, context, typed))
                continue
            for plan, parts in zip(plans, typed, strict=True):
                rows = self._rows_of(plan)
                for part in parts:
                    _append(rows, part)
            accepted += 1
        for plan in plans:  # the three tables exist even when the client has no history
            self._rows_of(plan)
        return accepted

    def build(self) -> dict[str, Landed]:
        """Every table touched so far, typed (the builder can be reused: it is emptied)."""
        built = {name: rows.to_landed() for name, rows in self._rows.items()}
        self._rows = {}
        return built

    # -- one row --------------------------------------------------------------------------------

    def _type_row(
        self, plan: _Plan, item: Any, context: Mapping[str, Any]
    ) -> tuple[list[Any], str | None] | str:
        """The typed values and extra JSON of one item, or the reason it is quarantined."""
        if type(item) is not dict:
            return f"expected an object, got {type(item).__name__}"
        get = item.get
        values: list[Any] = []
        append = values.append
        name = ""
        try:
            for name, source, where, convert, nullable, plain in plan.fields:
                if where is _ITEM:
                    value = get(source)
                elif where is _CONTEXT:
                    value = context[source]
                else:  # clientNumber: in the item (search, clientdetails) or known from the request
                    value = get(source)
                    if value is None:
                        value = context.get(source)
                if value is None:
                    if not nullable:
                        return f"{name}: missing required field {source!r}"
                    append(None)
                elif plain and type(value) is str and value.isascii():
                    append(value)  # the common case of id / text / enum, without a call
                else:
                    append(convert(value))
        except _Bad as bad:
            return f"{name}: {bad}"
        for position in plan.local_ts:
            moment = values[position]
            if moment is not None and moment.tzinfo is not None:
                store = get("storecode")
                if type(store) is not str:
                    store = context.get("@storecode")
                try:
                    values[position] = self.tz.to_local(moment, store)
                except OverflowError:
                    return f"{plan.fields[position][0]}: datetime out of range"
        return values, _extra(plan, item)

    def _type_receipt(
        self, plans: tuple[_Plan, _Plan, _Plan], item: Any, context: Mapping[str, Any]
    ) -> tuple[list[Any], list[Any], list[Any]] | str:
        header = self._type_row(plans[0], item, context)
        if isinstance(header, str):
            return header
        receipt = header[0][_position(plans[0], "receipt_number")]
        store = item.get("storecode")
        child_context = {
            "clientNumber": context["clientNumber"],
            "@receiptNumber": receipt,
            "@storecode": store if type(store) is str else None,
        }
        children: list[list[Any]] = []
        for plan, key in ((plans[1], "lines"), (plans[2], "payments")):
            parts = item.get(key)
            if parts is None:
                children.append([])
                continue
            if type(parts) is not list:
                return f"{key}: expected an array, got {type(parts).__name__}"
            typed_parts = []
            for index, part in enumerate(parts):
                typed = self._type_row(plan, part, child_context)
                if isinstance(typed, str):
                    return f"{plan.table.name}[{index}]: {typed}"
                typed_parts.append(typed)
            children.append(typed_parts)
        return [header], children[0], children[1]


def _position(plan: _Plan, column: str) -> int:
    return next(i for i, f in enumerate(plan.fields) if f[0] == column)


def _append(rows: _Rows, typed: tuple[list[Any], str | None]) -> None:
    values, extra = typed
    values.append(extra)
    rows.data.append(values)


def _extra(plan: _Plan, item: dict[Any, Any]) -> str | None:
    if plan.sources.issuperset(item):
        return None
    drop = plan.personal_extra
    extra = {
        k: _without(v, drop)
        for k, v in item.items()
        if k not in plan.sources and not _is_secret(k) and k not in drop
    }
    return to_json(extra) if extra else None


def _without(value: Any, names: frozenset[str]) -> Any:
    """``value`` without the fields of ``names`` at any depth (an emergency contact's phone)."""
    if not names:
        return value
    if isinstance(value, dict):
        return {k: _without(v, names) for k, v in value.items() if k not in names}
    if isinstance(value, list | tuple):
        return [_without(v, names) for v in value]
    return value


def _quarantined(table: str, item: Any, context: Mapping[str, Any], reason: str) -> QuarantineRow:
    return QuarantineRow(table, _client_of(item, context), reason, to_json(item))


def _check_context(plan: _Plan, context: Mapping[str, Any]) -> None:
    """A context value the table needs is the caller's duty, not the data's: raise."""
    missing = sorted(k for k in plan.context_keys if not isinstance(context.get(k), str))
    if missing:
        raise ValueError(f"landing {plan.table.name}: context needs string values for {missing}")


def _iterate(items: Iterable[Any]) -> Iterable[Any]:
    """Items as given; a lone object (an unwrapped endpoint) counts as one item."""
    if items is None:
        return ()
    if isinstance(items, dict):
        return (items,)
    if isinstance(items, str | bytes):
        return (items,)  # garbage: quarantined as one non-object item
    return items


# --- the contract's functions ---------------------------------------------------------------------


def to_arrow(
    table: Table | str, items: Iterable[Any], context: Mapping[str, Any], tz: TimezoneLookup | None = None
) -> Landed:
    """Type one request's items into ``table`` (``context``: "clientNumber", "@storecode", ...)."""
    builder = BatchBuilder(tz)
    builder.add(table, items, context)
    name = table if isinstance(table, str) else table.name
    return builder.build()[name]


def explode_transactions(
    items: list[Any], client_number: str, tz: TimezoneLookup | None = None
) -> dict[str, Landed]:
    """Transaction history as "transactions", "transaction_lines", "transaction_payments"."""
    builder = BatchBuilder(tz)
    builder.add_transactions(items, client_number)
    return builder.build()
