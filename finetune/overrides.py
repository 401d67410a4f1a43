"""Params changed by the commands, the benchmarks and the tests, validated like params.yaml: ``with_overrides`` (a
``Params`` with some keys changed) and ``validate_merged`` (params sections with a recipe's, a search space's or a
flag's keys set, as ``tools.recipe``, ``tools.search_space`` and ``tools.tune`` merge them).
"""

from __future__ import annotations

from typing import Any

from finetune.errors import ParamsError
from finetune.params import Params, validate_params


def with_overrides(params: Params, overrides: dict[str, dict[str, Any]], source: str = "overrides") -> Params:
    """``params`` with ``{"section": {"key": value}}`` changes applied and validated like params.yaml.

    Raises:
        ParamsError: an override names an unknown key or gives a bad value; the message names ``source``.
    """
    raw = params.model_dump()
    for section, values in overrides.items():
        raw.setdefault(section, {}).update(values)
    return validate_params(raw, source)


def validate_merged(base: dict, changes: dict[str, dict], base_source: str, changes_source: str) -> dict:
    """``base`` (params sections, e.g. params.yaml's) with ``changes`` (``{"section": {"key": value}}``, e.g. a
    recipe's) set, validated; returns the merged sections.

    Raises:
        ParamsError: ``changes`` choose a dataset (``data.dataset`` or ``data.config``) while ``base`` keeps its own
            files (``data.files``), naming ``base_source``'s ``data.files``; else the merge is not valid params,
            naming ``changes_source`` and the key.
    """
    merged = {section: dict(values) for section, values in base.items()}
    for section, values in changes.items():
        merged.setdefault(section, {}).update(values)
    data, files = changes.get("data", {}), base.get("data", {}).get("files")
    chosen = {key: data[key] for key in ("dataset", "config") if data.get(key) is not None}
    if files is not None and chosen and "files" not in data:
        raise ParamsError(f"{base_source}: data.files: {files} is set, but {changes_source} chooses a dataset "
                          f"({', '.join(f'data.{k}: {v}' for k, v in chosen.items())}); own files and a dataset can't "
                          f"both be set: set data.files: null in {base_source}")
    validate_params(merged, changes_source)
    return merged
