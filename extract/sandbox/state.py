"""The sandbox's whole service in memory: :class:`Service`, one method per operation. No HTTP.

:class:`Service` is the ground truth of the sandbox. Every endpoint of the catalogue is one
method named like the endpoint (``service.clientdetails("000417")``,
``service.insert_transaction(body)``), so the HTTP layer dispatches with
``getattr(service, endpoint.name)``. Reads take typed arguments (snake_case of the logical
query parameters); writes take the request body (a dict with the contract's logical field
names). Every method answers the contract's JSON (logical names, JSON-ready values) or
raises :class:`~.validation.ApiError` (status, snake_case code, a message naming the field).

Where each concern lives:

- :mod:`.core`: :class:`~.core.ServiceCore`, the state (its attributes are listed there), the
  lazy holdings, building and lookups;
- :mod:`.reads`: configuration reads, client reads, the client search;
- :mod:`.writes`: client writes and user writes;
- :mod:`.validation`: :class:`~.validation.ApiError` and the request field parsers.
"""

from __future__ import annotations

from membersync.extract.sandbox.reads import Reads
from membersync.extract.sandbox.writes import Writes


class Service(Reads, Writes):
    """The whole service in memory: the reads and the writes over one state."""
