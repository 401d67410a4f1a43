"""Which project files a stage runs (``project_files``: its module, the project modules it imports anywhere, and
the ``.py`` files they load by path) and their digest (``code_digest``), for dvc.yaml's deps (tests/test_dvc_yaml.py)
and the resume fingerprint. Package ``__init__.py`` files hold only a docstring and are left out.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("finetune", "stages", "tools", "benchmarks")


def module_path(name: str) -> Path | None:
    """The file of project module ``name`` (e.g. 'finetune.data.loading'), or None for a package or a
    module elsewhere.
    """
    if name.split(".")[0] not in PACKAGES:
        return None
    path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
    return path if path.is_file() else None


def _run_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``, which type checkers read and Python never runs."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            yield from (n for child in node.orelse for n in [child, *_run_nodes(child)])
            continue
        yield node
        yield from _run_nodes(node)


def _imports(path: Path) -> set[str]:
    """Names of the modules ``path`` imports, anywhere in the file that runs (``from a import b`` gives 'a' and
    'a.b')."""
    names = set()
    for node in _run_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _loaded_by_path(path: Path) -> set[Path]:
    """Project ``.py`` files named by module-level constants built from ``Path(__file__)`` in ``path``."""
    found = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and "Path(__file__)" in ast.unparse(node.value):
            value = eval(compile(ast.Expression(node.value), str(path), "eval"), {"Path": Path, "__file__": str(path)})
            if isinstance(value, Path) and value.suffix == ".py" and value.is_file():
                found.add(value.resolve())
    return found


def project_files(module: str) -> list[str]:
    """Every project file that running ``module`` executes, as sorted paths relative to the repository root. Found
    once per process and root (parsing every file takes a fraction of a second, and a training run, or a test
    session's many, asks again): the files' contents are read afresh by ``code_digest``.

    Raises:
        ValueError: ``module`` is not a module of this project.
    """
    return list(_project_files(module, ROOT))


@functools.cache
def _project_files(module: str, root: Path) -> tuple[str, ...]:
    """``project_files`` of ``module`` under ``root`` (``ROOT``, the cache's key with ``module``)."""
    start = module_path(module)
    if start is None:
        raise ValueError(f"{module!r} is not a module of this project (packages {', '.join(PACKAGES)})")
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo += [p for p in map(module_path, _imports(path)) if p is not None]
        todo += _loaded_by_path(path)
    return tuple(sorted(p.relative_to(root).as_posix() for p in seen))


def code_digest(module: str) -> str:
    """sha256 (16 hex digits) of the names and contents of ``project_files(module)``."""
    digest = hashlib.sha256()
    for name in project_files(module):
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    return digest.hexdigest()[:16]
