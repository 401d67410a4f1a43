"""The import graph (docs/code-layout.md): imports point down the layers, from the commands to the phases to the
core, and a function-level import is kept only for a heavy or optional dependency, saying why beside it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from finetune.code import PACKAGES, _imports, module_path
from tests.helpers import REPO

# Lowest first. A module imports project modules of its own group or of lower layers only.
LAYERS = [
    {"core": ["finetune/errors.py", "finetune/paths.py", "finetune/runtime.py", "finetune/tasks.py",
              "finetune/hardware.py", "finetune/checkpoint_files.py", "finetune/modeling.py", "finetune/params.py",
              "finetune/overrides.py", "finetune/code.py", "finetune/launch.py", "finetune/logs.py"]},
    {"data": ["finetune/data"]},
    {"inference": ["finetune/inference"]},
    {"evaluate": ["finetune/evaluate"], "distill": ["finetune/distill"]},
    {"train": ["finetune/train"], "export": ["finetune/export"], "card": ["finetune/card.py"]},
    {"stages": ["stages"], "tools": ["tools"]},
    {"benchmarks": ["benchmarks"]},  # they time the stages and the commands
]


def place(path: Path) -> tuple[int, str]:
    """``(layer, group)`` of a project file."""
    relative = path.relative_to(REPO).as_posix()
    for layer, groups in enumerate(LAYERS):
        for group, members in groups.items():
            if any(relative == m or relative.startswith(m + "/") for m in members):
                return layer, group
    raise AssertionError(f"{relative}: in no layer of LAYERS")


def project_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py") if p.name != "__init__.py")


def test_imports_point_down():
    upward = []
    for path in project_modules():
        layer, group = place(path)
        for name in sorted(_imports(path)):
            target = module_path(name)
            if target is None:
                continue
            to_layer, to_group = place(target)
            if to_layer > layer or (to_layer == layer and to_group != group):
                upward.append(f"{path.relative_to(REPO)} imports {name} ({group} -> {to_group})")
    assert upward == []


def test_every_module_has_a_layer():
    assert all(place(path) for path in project_modules())


def function_imports(path: Path) -> list[tuple[int, str, str]]:
    """``(line, the import, its reason)`` for every import inside a function of ``path``: the comment beside it, or
    the comment line above it or above the block of imports it is in (isort's groups, blank lines between)."""
    text = path.read_text()
    lines, found = text.splitlines(), set()
    for function in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    line, above = lines[node.lineno - 1], node.lineno - 2
                    while above >= 0 and (not lines[above].strip() or lines[above].strip().startswith(("import ",
                                                                                                     "from "))):
                        above -= 1  # a comment above a block of imports (blank lines between groups) covers it
                    comment = lines[above].strip() if above >= 0 else ""
                    beside = line.partition("#")[2].strip()
                    reason = beside or comment.removeprefix("#").strip() * comment.startswith("#")
                    found.add((node.lineno, line.strip(), reason))
    return sorted(found)


@pytest.mark.parametrize("package", PACKAGES)
def test_a_function_level_import_says_why(package):
    unexplained = [f"{path.relative_to(REPO)}:{line}: {statement}" for path in (REPO / package).rglob("*.py")
                   for line, statement, reason in function_imports(path) if not reason]
    assert unexplained == []


def test_an_unexplained_function_level_import_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import json\n\n    import re\n\n\ndef g():\n    # optional: only g needs it\n"
                      "    import csv\n    import os\n\n    import re\n\n\ndef h():\n    import os  # heavy\n")
    assert [(line, bool(reason)) for line, _, reason in function_imports(module)] == [
        (2, False), (4, False), (9, True), (10, True), (12, True), (16, True)]
