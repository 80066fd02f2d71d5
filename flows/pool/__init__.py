"""Many tenants on a schedule: the tenants file (``tenants.py``), one night per tenant on a
Prefect work pool (``tenant_flow.py``), a deployment on a schedule (``schedule.py``).

Invariant: a tenant's night is the same :mod:`membersync.flows.night` path a single ``sync`` takes.
"""
