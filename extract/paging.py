"""Paging as a small strategy: which page to ask for next, and when to stop.

``clients/search`` pages by number (``page``, 1-based by default; ``pageSize``) and says
how many items match in all (``totalCount``). The names and numbers come from the tenant
profile's ``[paging]`` table. Another server could page by cursor or offset: it would get
its own strategy with the same two methods, and :meth:`ServiceClient.search` would not
change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from membersync.extract import constants
from membersync.extract.profile import Profile
from membersync.extract.records import SearchPage


@dataclass(frozen=True, slots=True)
class PageNumberPaging:
    """Page numbers from ``first_page``; stop when ``totalCount`` items were seen or a page is short."""

    first_page: int = 1
    page_size: int = 500
    max_pages: int = constants.MAX_PAGES

    @classmethod
    def from_profile(cls, profile: Profile, page_size: int | None = None) -> PageNumberPaging:
        size = page_size or profile.page_size
        if not 1 <= size <= profile.max_page_size:
            raise ValueError(f"page_size must be between 1 and {profile.max_page_size}")
        return cls(first_page=profile.first_page, page_size=size)

    def first(self) -> int:
        return self.first_page

    def next(self, page: SearchPage, seen: int) -> int | None:
        """The page after ``page`` (``seen`` items so far), or None when done.

        A short page ends the listing even when ``totalCount`` promises more (clients
        matched at the start may no longer match): asking on would loop on empty pages.
        """
        if not page.items or len(page.items) < page.page_size:
            return None
        if page.total_count >= 0 and seen >= page.total_count:  # -1: the server did not say
            return None
        if page.page - self.first_page + 1 >= self.max_pages:
            return None
        return page.page + 1


def page_numbers(
    answer: dict[str, Any], profile: Profile, asked_page: int, asked_size: int
) -> tuple[int, int, int]:
    """(page, page_size, total_count) of a search answer, falling back to what we asked for."""
    page = _int(answer.get(profile.param("page")), asked_page)
    size = _int(answer.get(profile.param("pageSize")), asked_size)
    total = _int(answer.get(profile.total_key), -1)
    return page, size, total


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return default
