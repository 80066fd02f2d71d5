"""The warehouse build: dbt over the landed nights, published as DuckDB catalogs.

``builder.py`` runs the build incrementally (the nights the warehouse lacks) and swaps the new
catalogs in; ``dbt_run.py`` drives the dbt project in ``sql/``; ``catalog.py`` the catalogs of
views over Parquet parts and their readers; ``docs.py`` dbt's documentation site.

Invariant: a build publishes a whole warehouse or none, never over a newer one.
"""
