"""Identity in free text: the values that identify a person, masked wherever text is not trusted.

The landed columns are an allowlist (:mod:`membersync.models.tables`), and the personal ones go
to the identity tables (:mod:`membersync.models.privacy`). What the allowlist cannot vouch for is
text a person typed or a tenant added:

* **trusted as non-personal**: every column that is not text (ids, money, dates, counts,
  enumerations), and the text of the business's own lists (configuration tables: stores,
  products, packages, staff);
* **not trusted**: every text column of a row that belongs to a client (a points
  transaction's reason, a sale line's description) and the ``extra`` JSON of every row.

Untrusted text is masked before it lands: each value of :data:`MASKED_FIELDS` of every client
the night knows (the batch's, the night's discovery's, and every client the landing zone already
holds) is replaced by :data:`MASKED`, and so is a value whose keyed hash a forgotten client left
in the erasure register. Names and emails are matched word by word (case ignored; a word of
digits only is no name), a client number as a whole word, a phone as the same digits however
they are spaced.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

MASKED = "[withheld]"
# The identity columns whose values identify a person on their own (in client_identity): what
# forget scrubs from text files, whole values.
IDENTIFYING_FIELDS = ("client_number", "first_name", "last_name", "email", "phone", "address1")
# What untrusted text is masked for, word by word: an address's words ("12", "Elm") are too
# common to mask on their own, so the address is not among them.
MASKED_FIELDS = ("first_name", "last_name", "email", "phone")
MIN_WORD = 3  # a shorter value is not looked for (it would match everywhere)
MIN_PHONE_DIGITS = 7
_WORD = re.compile(r"[\w.@+-]+")
_PHONE = re.compile(r"\+?\d[\d\s().-]{5,}\d")
_TRIM = ".-+"


def words_of(value: str) -> list[str]:
    """The words a name or email is matched by: an email whole, a name's every word (a word of
    digits only is no name: a street number, a card's last four)."""
    out = []
    for word in _WORD.findall(value):
        word = word.strip(_TRIM).casefold()
        if len(word) >= MIN_WORD and not word.isdigit():
            out.append(word)
    return out


def digits_of(value: str) -> str:
    return "".join(c for c in value if c.isdigit())


def token_hash(key: bytes, token: str) -> str:
    """The keyed hash a forgotten client's word leaves in the erasure register."""
    return hmac.new(key, b"word:" + token.encode(), hashlib.sha256).hexdigest()[:32]


def identity_tokens(values: Iterable[str | None]) -> tuple[set[str], set[str]]:
    """The words (of names, emails) and phone numbers (digits) that identify the people of
    ``values``."""
    words: set[str] = set()
    phones: set[str] = set()
    for value in values:
        if not value:
            continue
        words.update(words_of(value))
        digits = digits_of(value)
        if len(digits) >= MIN_PHONE_DIGITS:
            phones.add(digits)
    return words, phones


def hashed_tokens(key: bytes, values: Iterable[str | None], numbers: Iterable[str] = ()) -> list[str]:
    """The keyed hashes of the identity tokens of ``values`` and of the client ``numbers`` (what
    may be written down of them)."""
    words, phones = identity_tokens(values)
    return sorted({token_hash(key, t) for t in words | phones | {n.casefold() for n in numbers}})


class IdentityMask:
    """Masks identity values in untrusted text (see the module's docstring): values known in
    the clear (the held clients', the batch's), and keyed hashes of others (the erasure
    register's forgotten clients, a night's discovery)."""

    def __init__(self, values: Iterable[str | None] = ()) -> None:
        self.words: set[str] = set()
        self.phones: set[str] = set()
        self.hashed: dict[bytes, set[str]] = {}
        self.add(values)

    def add(self, values: Iterable[str | None]) -> None:
        """Names, emails and phones (values of :data:`MASKED_FIELDS`)."""
        words, phones = identity_tokens(values)
        self.words |= words
        self.phones |= phones

    def add_numbers(self, numbers: Iterable[str | None]) -> None:
        """Client numbers: masked as whole words."""
        self.words.update(n.casefold() for n in numbers if n and len(n) >= MIN_WORD)

    def add_hashed(self, key: bytes, hashes: Iterable[str]) -> None:
        self.hashed.setdefault(key, set()).update(hashes)

    @property
    def empty(self) -> bool:
        return not (self.words or self.phones or any(self.hashed.values()))

    def _known(self, token: str) -> bool:
        if token in self.words or token in self.phones:
            return True
        return any(token_hash(key, token) in hashes for key, hashes in self.hashed.items() if hashes)

    def _word(self, match: re.Match[str]) -> str:
        token = match.group().strip(_TRIM).casefold()
        return MASKED if len(token) >= MIN_WORD and self._known(token) else match.group()

    def _phone(self, match: re.Match[str]) -> str:
        return MASKED if self._known(digits_of(match.group())) else match.group()

    def text(self, value: str) -> str:
        """``value`` with every identity value replaced by :data:`MASKED`."""
        if self.empty:
            return value
        return _WORD.sub(self._word, _PHONE.sub(self._phone, value))

    def array(self, values: pa.ChunkedArray | pa.Array) -> pa.Array:
        """A string column masked, each distinct value once."""
        column = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        if self.empty or pc.count(column).as_py() == 0:
            return column
        distinct = pc.unique(column)
        masked = pa.array([None if v is None else self.text(v) for v in distinct.to_pylist()], pa.string())
        return masked.take(pc.index_in(column, value_set=distinct))
