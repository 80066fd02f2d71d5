"""The dbt project's models as its YAML declares them: name, layer, grain, key, storage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from membersync.warehouse.build import dbt_run

SQL_DIR = dbt_run.SQL_DIR


LAYERS = ("staging", "marts", "reports", "identity")


@dataclass(frozen=True)
class Model:
    """A dbt model as analysts see it: ``<layer>.<table>`` with its grain and key (from its YAML)."""

    name: str  # schema.table
    layer: str
    path: Path
    grain: str
    key: tuple[str, ...]
    storage: str


def load_models(sql_dir: Path | None = None) -> list[Model]:
    """Every model of the dbt project (default: the package's ``sql/``), from its layer's YAML."""
    root = sql_dir or SQL_DIR
    models = []
    for entry in dbt_run.model_yaml(root):
        config = entry.get("config") or {}
        meta = config.get("meta") or {}
        name = str(entry["name"])
        table = name.removeprefix("stg_").removeprefix("identified_")
        models.append(
            Model(
                name=f"{config.get('schema', entry['_layer'])}.{table}",
                layer=entry["_layer"],
                path=dbt_run.sql_path(root, entry["_layer"], name),
                grain=str(meta.get("grain", "")),
                key=tuple(meta.get("key") or ()),
                storage=str(meta.get("storage", "")),
            )
        )
    return models
