"""DVC's model registry: the `artifacts:` entry of dvc.yaml, and `dvc artifacts get` of it by version and stage (GTO
git tags) from a bare git origin and a folder DVC remote, offline. The project has no DVC remote, so the second test
builds a small repository with the same entry; the README's registry commands are run as written."""

from __future__ import annotations

import inspect
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, dvc, project_env, run

DVC_YAML = yaml.safe_load((REPO / "dvc.yaml").read_text())
README_HEADING = "### The model in DVC's model registry"


def the_model_artifact() -> tuple[str, dict]:
    """The fine-tuned model's artifact of dvc.yaml: its name and entry (the other is its served forms)."""
    assert set(DVC_YAML["artifacts"]) == {"text-classifier", "text-classifier-served"}
    return "text-classifier", DVC_YAML["artifacts"]["text-classifier"]


def readme_commands() -> list[list[str]]:
    """The commands of the README's registry code block, split as the shell does (comments dropped)."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index(README_HEADING):], re.S).group(1)
    return [args for line in block.splitlines() if (args := shlex.split(line, comments=True))]


def gto(*args: str) -> list[str]:
    """A command line running this venv's GTO (installed with DVC)."""
    return [str(Path(sys.executable).parent / "gto"), *args]


def test_the_model_artifacts_name_the_fine_tuned_and_exported_models_outputs(tmp_path):
    from gto.constants import assert_name_is_valid

    outs = {(o if isinstance(o, str) else next(iter(o))): stage for stage, s in DVC_YAML["stages"].items()
            for o in s.get("outs", [])}
    for name, entry in DVC_YAML["artifacts"].items():
        assert_name_is_valid(name)  # GTO's rule, which dvc artifacts get and the tags follow
        assert entry["type"] == "model" and entry["desc"] and entry["labels"]
        # The path is an output of a stage (the model with its card, its served forms): `dvc push` sends it.
        assert entry["path"] in outs, f"{entry['path']} is no stage's output"
    assert outs[the_model_artifact()[1]["path"]] == "card" and outs["models/exported"] == "export"

    # DVC itself reads the entry (its schema, the params interpolation of the stages) from the project's files.
    for f in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / f, tmp_path / f)
    run(dvc("init", "--no-scm", "-q"), tmp_path)
    from dvc.annotations import Artifact
    from dvc.repo import Repo

    with Repo(str(tmp_path)) as repo:
        assert repo.artifacts.read() == {"dvc.yaml": {n: Artifact(**e) for n, e in DVC_YAML["artifacts"].items()}}


def model_files(version: str) -> dict[str, bytes]:
    """A small stand-in for a model folder, different per version."""
    return {"config.json": f'{{"version": "{version}"}}'.encode(),
            "model.safetensors": bytes(range(256)) * 4 + version.encode(),
            "README.md": f"# A model, version {version}\n".encode()}


# The stage's script (after PATH = the artifact's path): model_files' own source, then the folder it writes.
MAKE_MODEL = inspect.getsource(model_files) + """
import pathlib
out = pathlib.Path(PATH)
out.mkdir(parents=True, exist_ok=True)
for name, content in model_files(pathlib.Path("version.txt").read_text().strip()).items():
    (out / name).write_bytes(content)
"""


def read_folder(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.e2e
def test_artifacts_get_by_version_and_stage_through_a_folder_remote(tmp_path):
    name, entry = the_model_artifact()
    env = {k: v for k, v in project_env(DVC_STUDIO_OFFLINE="1").items() if "STUDIO_TOKEN" not in k}
    first, origin, storage, consumer = (tmp_path / d for d in ("first", "origin.git", "dvc-storage", "consumer"))
    first.mkdir()
    consumer.mkdir()

    def sh(*cmds: list[str], cwd: Path = first, ok: bool = True) -> str:
        return "".join(run(cmd, cwd, env, ok=ok) for cmd in cmds)

    # A project with the same artifact entry and a stage that writes a small "model" into its path.
    (first / "dvc.yaml").write_text(yaml.safe_dump({
        "stages": {"train": {"cmd": "python make_model.py", "deps": ["make_model.py", "version.txt"],
                             "outs": [entry["path"]]}},
        "artifacts": {name: entry}}, sort_keys=False))
    (first / "make_model.py").write_text(f"PATH = {entry['path']!r}\n" + MAKE_MODEL)
    (first / "version.txt").write_text("1\n")
    sh(["git", "init", "-q", "-b", "main"], dvc("init", "-q"), dvc("remote", "add", "-d", "store", str(storage)),
       dvc("repro", "-q"), dvc("push", "-q"), ["git", "add", "-A"], ["git", "commit", "-qm", "model 1"],
       ["git", "init", "-q", "--bare", "-b", "main", str(origin)], ["git", "remote", "add", "origin", str(origin)],
       ["git", "push", "-q", "origin", "main"])
    v1 = sh(["git", "rev-parse", "HEAD"]).strip()

    # The README's commands, as written: gto register and assign, git push of the tags.
    commands = readme_commands()
    tagging = [args for args in commands if args[0] in ("gto", "git")]
    assert [args[:2] for args in tagging] == [["gto", "register"], ["gto", "assign"], ["git", "push"]]
    assert all(args[2] == name for args in tagging[:2]), "the README's gto commands name another artifact"
    sh(*[gto(*args[1:]) if args[0] == "gto" else args for args in tagging])
    assert set(sh(["git", "tag"]).split()) == {f"{name}@v1.0.0", f"{name}#prod#1"}

    # A second model, registered v1.1.0; and a lightweight tag on the first, which GTO and DVC ignore.
    (first / "version.txt").write_text("2\n")
    sh(dvc("repro", "-q"), dvc("push", "-q"), ["git", "add", "-A"], ["git", "commit", "-qm", "model 2"],
       gto("register", name, "--version", "v1.1.0"), ["git", "tag", f"{name}@v2.0.0", v1],
       ["git", "push", "-q", "origin", "main", "--tags"])
    shutil.rmtree(first)  # from here on only the git origin and the DVC remote exist

    # The README's dvc artifacts get lines: the highest version, a version, a stage.
    gets = [[str(origin) if a == "<repo-url>" else a for a in args] for args in commands if args[:3] == [
        "dvc", "artifacts", "get"]]
    assert len(gets) == 3 and all(args[4] == name for args in gets)
    for args in gets:
        out = args[args.index("-o") + 1]
        sh(dvc(*args[1:]), cwd=consumer)
        expected = "1" if {"--rev", "--stage"} & set(args) else "2"
        assert read_folder(consumer / out) == model_files(expected), args

    # From another clone (a path), and in Python: dvc.api.artifacts_show gives the commit and path of a stage.
    sh(["git", "clone", "-q", str(origin), str(consumer / "clone")], cwd=consumer)
    sh(dvc("artifacts", "get", str(consumer / "clone"), name, "--rev", "v1.1.0", "-o", "from-clone"), cwd=consumer)
    assert read_folder(consumer / "from-clone") == model_files("2")
    from dvc.api import artifacts_show

    assert artifacts_show(name, stage="prod", repo=str(origin)) == {"rev": v1, "path": entry["path"]}

    # What does not resolve: a version without its v, and a lightweight tag.
    for rev in ("1.0.0", "v2.0.0"):
        out = sh(dvc("artifacts", "get", str(origin), name, "--rev", rev, "-o", f"bad-{rev}"), cwd=consumer, ok=False)
        assert f"Unable to find artifact '{name} @ {rev}'" in out
