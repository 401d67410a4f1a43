"""dvc.yaml checks itself: each stage's deps list every project file the stage runs (its imports, followed, and the
files loaded by path), and no code file it does not run."""

from __future__ import annotations

import ast
import copy
import re

import pytest
import yaml

from finetune.code import PACKAGES, project_files
from tests.helpers import REPO

DVC_YAML = yaml.safe_load((REPO / "dvc.yaml").read_text())


def code_deps_drift(dvc_yaml: dict) -> dict[str, dict[str, list[str]]]:
    """Per stage, the code files it runs but does not list (``missing``) and lists but does not run (``extra``).

    The modules a stage runs are the ``-m <module>`` of its cmd.
    """
    drift = {}
    for name, stage in dvc_yaml["stages"].items():
        modules = re.findall(r"-m ([\w.]+)", stage["cmd"])
        runs = {f for module in modules for f in project_files(module)}
        listed = {d for d in stage.get("deps", []) if isinstance(d, str) and d.endswith(".py")}
        missing, extra = sorted(runs - listed), sorted(listed - runs)
        if missing or extra:
            drift[name] = {"missing": missing, "extra": extra}
    return drift


def test_every_stage_lists_exactly_the_code_it_runs():
    assert code_deps_drift(DVC_YAML) == {}


def test_every_stage_runs_a_project_module():
    for name, stage in DVC_YAML["stages"].items():
        assert re.findall(r"-m (stages\.\w+)", stage["cmd"]), f"stage {name!r}: cmd runs no stages.<module>"


def test_a_missing_import_or_metric_module_is_caught():
    # The drifts this check was written for: download importing a module it does not list, and train not listing the
    # metric module that picks the best epoch (loaded by path with evaluate.load, not imported).
    broken = copy.deepcopy(DVC_YAML)
    broken["stages"]["download"]["deps"].remove("finetune/data/sources.py")
    broken["stages"]["train"]["deps"] = [d for d in broken["stages"]["train"]["deps"]
                                         if d != "finetune/evaluate/glue_metric.py"]
    broken["stages"]["tokenize"]["deps"].append("finetune/train/recipe.py")
    assert code_deps_drift(broken) == {
        "download": {"missing": ["finetune/data/sources.py"], "extra": []},
        "train": {"missing": ["finetune/evaluate/glue_metric.py"], "extra": []},
        "tokenize": {"missing": [], "extra": ["finetune/train/recipe.py"]},
    }


def test_imports_inside_functions_are_followed():
    # benchmarks.pipeline imports the stages' library code inside a function; it counts as code it runs.
    assert {"finetune/data/download.py", "finetune/evaluate/predictions.py", "finetune/train/recipe.py"} <= set(
        project_files("benchmarks.benchmark"))


@pytest.mark.parametrize("package", PACKAGES)
def test_package_init_files_hold_only_a_docstring(package):
    # project_files leaves __init__.py out: that is only right while they run no code.
    init = REPO / package / "__init__.py"
    if init.exists():
        body = ast.parse(init.read_text()).body
        assert all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body), init


def test_an_unknown_module_is_refused():
    with pytest.raises(ValueError, match="'numpy' is not a module of this project"):
        project_files("numpy")


def test_the_teacher_stage_lists_every_distill_param_its_code_reads():
    # The teacher stage lists its distill params one by one (alpha and temperature must not rerun it). One its code
    # reads but dvc.yaml does not list leaves a stale data/teacher that the train stage then refuses.
    stage = DVC_YAML["stages"]["teacher"]
    code = "".join((REPO / f).read_text() for m in re.findall(r"-m ([\w.]+)", stage["cmd"]) for f in project_files(m))
    read = set(re.findall(r"params\.distill\.(\w+)", code))
    assert {"teacher", "transfer"} <= read
    assert {f"distill.{key}" for key in read} <= set(stage["params"]), read
