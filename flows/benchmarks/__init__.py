"""Every benchmark of membersync, in one place (speed targets live here, never in timed tests).

A benchmark may import from every layer; no product code imports a benchmark except the
``membersync bench`` command in ``flows/cli/commands.py``, inside the command
(``tests/house/test_import_graph.py`` checks this). The current figures and their targets, each
with its command and commit: docs/benchmarks.md (earlier ones: ``git log``).

- :mod:`.sync`: the nightly sync, the sandbox in its own process and the sync in a child
  process: throughput, our CPU per request, 429s, peak RSS, Prefect's overhead; politeness at
  the limit; the cost of whole histories::

      membersync bench --clients 10000 --clients 100000
      python -m membersync.flows.benchmarks.sync run --clients 10000   # the same, without the CLI
      membersync bench --rate-matrix --rates 20,50,200,500 --bursts 1,5,R --latencies 20 --seconds 15
      membersync bench --history-cost --clients 10000

- :mod:`.sandbox`: the sandbox alone, pinned to one core (it must never be the bottleneck)::

      membersync bench --sandbox-only --clients 100000
      python -m membersync.flows.benchmarks.sandbox [clients] [seconds]   # one count, as JSON

- :mod:`.cpu`: our CPU per request as a marginal between two night sizes, split by where it is
  spent (py-spy; :mod:`.flame` reads its folded stacks and draws the flame graph), and Prefect's
  fixed cost before a night's first request::

      python -m membersync.flows.benchmarks.cpu marginal --sizes 1000,4000 --runs 3
      python -m membersync.flows.benchmarks.cpu profile --sizes 1000,4000 [--out DIR]
      python -m membersync.flows.benchmarks.cpu prefect --runs 3 [--prefect-home DIR]

- :mod:`.transport`: the client's CPU per request with each httpx transport::

      python -m membersync.flows.benchmarks.transport [--requests N] [--concurrency C] [--repeats R]

- :mod:`.coerce`: typing wire items into Arrow, per request and batched::

      python -m membersync.flows.benchmarks.coerce [--clients N] [--per-client K] [--batch B]

- :mod:`.s3_night`: two nights on S3 (moto) with the lease and the Delta publication: what
  each adds to a night's wall time, and the published bytes against the landed::

      python -m membersync.flows.benchmarks.s3_night --clients 10000

- :mod:`.publish`: the PostgreSQL publication: a night's incremental publish against its build,
  and ``--full`` of the history (a throwaway database)::

      python -m membersync.flows.benchmarks.publish DIR --url postgresql://me@127.0.0.1:5432/bench

- :mod:`.refresh`: a full refresh of a landed history in bounded memory (``MEMBERSYNC_BUILD_MEMORY``,
  optionally in a memory cgroup): wall time, peak RSS, batches, the reports compared byte for byte::

      python -m membersync.flows.benchmarks.refresh DIR --memory unset --memory 2GB [--cgroup 2GB]

- :mod:`.build`: one night's warehouse build as history accumulates, on the synthetic history
  of :mod:`membersync.flows.benchmarks.synthetic`::

      python -m membersync.flows.benchmarks.build --clients 5000 --night 2 --night 30 --night 90

- :mod:`.work_pool`: many tenants on a Prefect work pool, and one tenant in shards (a real server,
  workers and one sandbox per tenant): wall time and each tenant's limit held::

      python -m membersync.flows.benchmarks.work_pool tenants --clients 5000 --workers 1 --workers 3
      python -m membersync.flows.benchmarks.work_pool sharded --clients 20000 --shards 3 --workers 3

- :mod:`.forget`: ``membersync forget`` in a long history: wall time and bytes written against
  the landed bytes (the cost follows the identity files, not the history)::

      python -m membersync.flows.benchmarks.forget --clients 100000 --nights 365 --forget 1 --forget 100
"""
