"""The warehouse build: dbt over the landed nights, published as DuckDB catalogs.

``builder.py`` runs the build incrementally (the nights the warehouse lacks); ``dbt_run.py``
drives the dbt project in ``sql/`` (its models as declared: ``project.py``) and ``verdict.py``
judges the run; ``catalog.py`` holds the catalogs of views over Parquet parts and their readers,
``publish.py`` swaps a new one in (a build's, or a lifecycle edit's without a rebuild);
``errors.py`` is what a build fails with; ``docs.py`` dbt's documentation site.

Invariant: a build publishes a whole warehouse or none, never over a newer one.
"""
