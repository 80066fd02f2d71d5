"""The sandbox's refusals and request parsing: :class:`ApiError` and its constructors, the parsers
of body fields and values (each names the field in its error), and the small helpers of the reads
and the writes (date ranges, passwords, months, phone digits). No state.
"""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from membersync.extract.sandbox import model as m

JSON = dict[str, Any]
UTC = dt.UTC

MIN_PASSWORD = 8
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ApiError(Exception):
    """A refusal of the service: HTTP status, snake_case code, message naming the field."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> JSON:
        return {"error": {"code": self.code, "message": self.message}}


def bad(code: str, message: str) -> ApiError:
    return ApiError(400, code, message)


def missing(field: str) -> ApiError:
    return bad("missing_field", f"{field} is required")


def invalid(field: str, why: str) -> ApiError:
    return bad("invalid_value", f"{field} {why}")


def not_found(field: str, value: object) -> ApiError:
    return ApiError(
        404,
        f"{_snake(field).removesuffix('_number').removesuffix('_id')}_not_found",
        f"{field} {value!r} not found",
    )


def conflict(code: str, message: str) -> ApiError:
    return ApiError(409, code, message)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


# --- body field parsers (each names the field in its error) -------------------------------------


def _given(body: JSON, name: str) -> bool:
    value = body.get(name)
    return value is not None and value != ""


def _text(body: JSON, name: str, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise missing(name)
        return None
    if not isinstance(value, str):
        raise invalid(name, "must be a string")
    return value


def _req_text(body: JSON, name: str) -> str:
    value = _text(body, name)
    assert value is not None
    return value


def _int(body: JSON, name: str, required: bool = True) -> int | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise missing(name)
        return None
    if isinstance(value, bool):
        raise invalid(name, "must be a whole number")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise invalid(name, "must be a whole number")


def _req_int(body: JSON, name: str) -> int:
    value = _int(body, name)
    assert value is not None
    return value


def parse_money(value: object, name: str) -> Decimal:
    """A JSON number or numeric string with at most 2 decimals -> Decimal (2 places)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise invalid(name, "must be an amount (number or numeric string)")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise invalid(name, "must be an amount (number or numeric string)") from None
    if not amount.is_finite():
        raise invalid(name, "must be a finite amount")
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -2 and amount != amount.quantize(m.CENT):
        raise invalid(name, "must have at most 2 decimals")
    return amount.quantize(m.CENT)


def _money(body: JSON, name: str, *, positive: bool = False, default: Decimal | None = None) -> Decimal:
    value = body.get(name)
    if value is None or value == "":
        if default is not None:
            return default
        raise missing(name)
    amount = parse_money(value, name)
    if positive and amount <= 0:
        raise invalid(name, "must be greater than 0")
    if amount < 0:
        raise invalid(name, "must not be negative")
    return amount


def _bool(body: JSON, name: str, default: bool | None = None) -> bool:
    value = body.get(name)
    if value is None:
        if default is None:
            raise missing(name)
        return default
    if not isinstance(value, bool):
        raise invalid(name, "must be true or false")
    return value


def parse_date(value: object, name: str) -> dt.date:
    if not isinstance(value, str) or not _DATE.fullmatch(value):
        raise bad("invalid_date", f"{name} must be a date YYYY-MM-DD")
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise bad("invalid_date", f"{name} must be a date YYYY-MM-DD") from None


def _date(body: JSON, name: str, required: bool = True) -> dt.date | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise missing(name)
        return None
    return parse_date(value, name)


def parse_utc(value: str, name: str) -> dt.datetime:
    """``YYYY-MM-DDTHH:MM:SSZ`` (an offset is honoured; no offset = UTC)."""
    try:
        parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise bad("invalid_datetime", f"{name} must be a UTC datetime YYYY-MM-DDTHH:MM:SSZ") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def hash_password(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)


def add_months(day: dt.date, months: int) -> dt.date:
    month0 = day.month - 1 + months
    year, month = day.year + month0 // 12, month0 % 12 + 1
    return dt.date(year, month, min(day.day, calendar.monthrange(year, month)[1]))


def _check_range(start: dt.date, end: dt.date) -> None:
    if end < start:
        raise bad("invalid_date_range", "endDate must not be before startDate")


def _check_password(value: object, name: str) -> None:
    if not isinstance(value, str):
        raise invalid(name, "must be a string")
    if len(value) < MIN_PASSWORD:
        raise invalid(name, f"must be at least {MIN_PASSWORD} characters")


def _digits(value: str) -> str:
    return "".join(ch for ch in value if ch.isdigit())
