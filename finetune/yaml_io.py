"""YAML 1.2, read and written as DVC reads and writes params.yaml and dvc.lock."""

from __future__ import annotations

from typing import Any

from ruamel.yaml import YAML, YAMLError

from finetune.errors import ParamsError


def yaml_reader() -> YAML:
    """A YAML 1.2 reader (and writer), as DVC reads and writes params.yaml: `dvc exp run -S` writes ``no`` and
    ``3e-5`` unquoted, which PyYAML's YAML 1.1 would read as False and as a string. ``load`` raises ruamel's
    ``YAMLError`` on text that is not YAML."""
    return YAML(typ="safe", pure=True)


def read_yaml(text: str, source: str) -> Any:
    """``text`` read with ``yaml_reader``.

    Raises:
        ParamsError: ``text`` is not YAML; the message names ``source``.
    """
    try:
        return yaml_reader().load(text)
    except YAMLError as err:
        raise ParamsError(f"{source}: not valid YAML: {err}") from None
