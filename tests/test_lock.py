"""requirements.lock still matches pyproject.toml: every dependency of the project and of its test extra is pinned
there at a version its specifier allows, with hashes, and the lock's direct dependencies are exactly those. A change
to either list without rerunning pip-compile (the command in the lock's header, docs/reproducibility.md, "Locked
environment") fails here, offline and in well under a second."""

from __future__ import annotations

import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helpers import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+, the Python the lock is made for

LOCK = REPO / "requirements.lock"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]["name"]
# the extras the lock covers: pip-compile --extra=test --extra=tune --extra=serve
LOCKED_EXTRAS = ("test", "tune", "serve")


def parse_lock(text: str) -> dict[str, dict]:
    """requirements.lock, as pip-compile writes it, as {canonical name: {"version", "hashes", "via"}}.

    An entry is ``name==version \\`` then its ``--hash=sha256:…`` lines, then ``# via x`` or ``# via`` and one
    ``#   x`` line per dependent. Hand-written for this one file's format: the venv has no public parser of
    requirement files that keeps the ``# via`` comments (pip-requirements-parser isn't a dependency; pip's and
    pip-tools' parsers are their internals, ``pip._internal``), and any line it doesn't know fails the tests, so a
    pip-tools bump that changes the format is caught here.
    """
    entries: dict[str, dict] = {}
    entry = None
    in_via = False
    for line in text.splitlines():
        stripped = line.strip()
        if match := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)\s*\\?$", line):
            entry = {"version": match[2], "hashes": [], "via": set()}
            entries[canonicalize_name(match[1])] = entry
            in_via = False
        elif entry is not None and (match := re.match(r"^--hash=(\w+:\w+)", stripped)):
            entry["hashes"].append(match[1])
        elif entry is not None and (match := re.match(r"^#\s+via\b\s*(.*)$", stripped)):
            in_via = True
            if match[1]:
                entry["via"].add(match[1].strip())
        elif entry is not None and in_via and (match := re.match(r"^#\s{2,}(\S.*)$", stripped)):
            entry["via"].add(match[1].strip())
        elif stripped and not stripped.startswith("--hash"):
            in_via = False
            if not stripped.startswith("#"):
                raise AssertionError(f"requirements.lock: unexpected line {line!r}")
    return entries


LOCKED = parse_lock(LOCK.read_text())


def project_requirements() -> list[Requirement]:
    """The project's dependencies and those of the extras the lock covers, less any whose marker is false here."""
    lines = list(PYPROJECT["project"]["dependencies"])
    for extra in LOCKED_EXTRAS:
        lines += PYPROJECT["project"]["optional-dependencies"][extra]
    reqs = [Requirement(line) for line in lines]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def test_our_lock_pins_every_pyproject_requirement_at_a_version_it_allows():
    problems = []
    for req in project_requirements():
        pin = LOCKED.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{req}: not in requirements.lock")
        elif not req.specifier.contains(pin["version"], prereleases=True):
            problems.append(f"{req}: requirements.lock pins {pin['version']}")
    assert not problems, "pyproject.toml changed without regenerating requirements.lock:\n" + "\n".join(problems)


def test_our_locks_direct_dependencies_are_exactly_our_pyprojects():
    direct = {name for name, pin in LOCKED.items() if f"{PROJECT} (pyproject.toml)" in pin["via"]}
    wanted = {canonicalize_name(r.name) for r in project_requirements()}
    assert direct == wanted, (
        "pyproject.toml changed without regenerating requirements.lock: "
        f"only in pyproject.toml {sorted(wanted - direct)}, only in the lock {sorted(direct - wanted)}"
    )


def test_every_pin_of_our_lock_is_exact_with_sha256_hashes():
    assert len(LOCKED) > 50  # the parser read the whole lock
    for name, pin in LOCKED.items():
        Version(pin["version"])  # a version, not a range
        assert pin["hashes"], f"{name} has no --hash in requirements.lock"
        assert all(h.startswith("sha256:") for h in pin["hashes"]), name


def test_our_lock_pins_the_cpu_torch_wheel():
    # The CPU build by its local version label: pip takes the CPU wheel and never PyPI's CUDA build of 2.13.0.
    # GPU machines install their own build first (TORCH_SPEC, .ci/setup) and the lock without this line.
    assert LOCKED["torch"]["version"] == "2.13.0+cpu"


def test_our_locks_header_names_the_pip_compile_command_over_our_pyproject():
    lines = LOCK.read_text().splitlines()
    header = "\n".join(lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))])
    # (pip-compile writes its options here but not --upgrade-package, the torch pin:
    # test_our_lock_pins_the_cpu_torch_wheel)
    for option in ("pip-compile", "--extra=test", "--extra=tune", "--extra=serve", "--generate-hashes",
                   "--allow-unsafe",
                   "--output-file=requirements.lock", "pyproject.toml"):
        assert option in header, option
