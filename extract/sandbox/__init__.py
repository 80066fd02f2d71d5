"""The sandbox: our complete implementation of the service, real HTTP on loopback.

- :mod:`.state`: the in-memory :class:`~.state.Service` (ground truth, one method per operation).
- :mod:`.population`: deterministic synthetic data from a seed, from :mod:`.data`'s vocabulary
  and with :mod:`.edge_cases`' report edge cases.
- :mod:`.server`: the aiohttp server; :mod:`.running` runs it (:func:`~.running.serve_forever`,
  :func:`~.running.start_in_thread`).

Its own throughput benchmark is :mod:`membersync.flows.benchmarks.sandbox` (``membersync bench
--sandbox-only``).
"""
