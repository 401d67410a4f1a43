"""Per-task recipes (tools/recipe.py): a recipe file becomes the `dvc exp run -S` pairs that give exactly the
committed params plus the recipe, whatever an earlier experiment left in the workspace's params.yaml."""

import copy
import os
import subprocess
import sys

import pytest
import yaml
from dvc.utils.hydra import apply_overrides

from finetune.errors import ParamsError
from finetune.params import load_params
from tests.helpers import REPO
from tools.recipe import RECIPES, commands, load_recipe, main, read_yaml, set_params


def committed() -> dict:
    return read_yaml((REPO / "params.yaml").read_text(), "params.yaml")


def test_the_pairs_undo_what_an_earlier_experiment_left_and_apply_the_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # train.accelerate_config is relative to the working directory
    workspace = copy.deepcopy(committed())  # as `dvc exp run -n sst2 -S data.config=sst2 -S train.epochs=1` leaves it
    workspace["data"]["config"], workspace["train"]["epochs"], workspace["model"]["pooling"] = "sst2", 1, "mean"
    recipe = {"data": {"config": "rte"}, "train": {"lr": 3e-5, "scheduler": "linear", "warmup_ratio": 0.1}}
    pairs = set_params(recipe, committed(), workspace)
    assert sorted(pairs) == sorted(["data.config=rte", "model.pooling=cls", "train.epochs=3", "train.lr=3e-05",
                                    "train.scheduler=linear", "train.warmup_ratio=0.1"])
    # What DVC does with them (dvc.utils.hydra.apply_overrides is `dvc exp run -S`): committed params + recipe.
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(workspace))
    apply_overrides(path, pairs)
    expected = copy.deepcopy(committed())
    for section, values in recipe.items():
        expected[section].update(values)
    assert load_params(path).model_dump() == load_params_dict(expected, tmp_path)


def load_params_dict(raw: dict, folder) -> dict:
    path = folder / "expected.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_params(path).model_dump()


def test_nothing_to_set_when_the_workspace_already_has_the_recipe(monkeypatch):
    monkeypatch.chdir(REPO)
    recipe = {"data": {"config": "rte"}}
    workspace = copy.deepcopy(committed())
    workspace["data"]["config"] = "rte"
    assert set_params(recipe, committed(), workspace) == []


def test_a_bad_recipe_is_refused_naming_its_file_and_key(monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(ParamsError, match=r"^configs/tasks/x.yaml: train.lr_rate: Extra inputs are not permitted"):
        set_params({"train": {"lr_rate": 1e-5}}, committed(), committed(), source="configs/tasks/x.yaml")
    workspace = copy.deepcopy(committed())
    own = {"dataset": None, "config": None, "text_columns": ["text"]}
    workspace["data"].update(own, files={"train": "data/own/a.csv"})
    with pytest.raises(ParamsError, match="data.files: -S would merge"):
        set_params({"data": {**own, "files": {"train": "data/own/b.csv"}}}, committed(), workspace)
    with pytest.raises(ParamsError, match="no recipe for 'nope'; recipes: "):
        load_recipe("nope")


@pytest.mark.parametrize("task", sorted(p.stem for p in (REPO / RECIPES).glob("*.yaml")))
def test_every_shipped_recipe_is_valid_params_for_its_task(task, monkeypatch):
    monkeypatch.chdir(REPO)
    recipe = load_recipe(task)
    assert recipe["data"]["config"] == task
    set_params(recipe, committed(), committed(), source=f"configs/tasks/{task}.yaml")  # raises when invalid
    assert "metrics/tasks/README.md" in (REPO / RECIPES / f"{task}.yaml").read_text()  # says where it came from


def test_one_command_per_seed(monkeypatch):
    monkeypatch.chdir(REPO)
    task = sorted(p.stem for p in (REPO / RECIPES).glob("*.yaml"))[0]
    runs = commands(task, seeds=[42, 1], queue=True, name=None)
    assert [argv[:6] for argv in runs] == [["dvc", "exp", "run", "--queue", "-n", f"{task}-recipe-s{s}"]
                                          for s in (42, 1)]
    assert [argv[-2:] for argv in runs] == [["-S", "train.seed=42"], ["-S", "train.seed=1"]]
    assert sum(a.startswith("train.seed=") for a in runs[0]) == 1
    out = subprocess.run([sys.executable, "-m", "tools.recipe", task], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith(f"dvc exp run -n {task}-recipe -S data.config={task}")


def test_a_searchs_recipe_is_named_apart_from_the_hand_recipe_of_its_task(monkeypatch, tmp_path):
    # a study named after its space (rte) would otherwise run its best configuration as rte-recipe, the hand recipe's
    monkeypatch.chdir(REPO)
    found = tmp_path / "metrics/search/rte/recipe.yaml"
    found.parent.mkdir(parents=True)
    found.write_text("data:\n  config: rte\ntrain:\n  lr: 3.0e-05\n")
    [searched] = commands(str(found), seeds=None, queue=False, name=None)
    [by_hand] = commands("rte", seeds=None, queue=False, name=None)
    assert (searched[:5], by_hand[:5]) == (["dvc", "exp", "run", "-n", "rte-best"], ["dvc", "exp", "run", "-n",
                                                                                      "rte-recipe"])


def test_a_recipe_choosing_a_dataset_over_committed_own_files_names_params_yaml(monkeypatch):
    # the conflicting key is the committed params.yaml's data.files, not the recipe's data.config
    monkeypatch.chdir(REPO)
    own = copy.deepcopy(committed())
    own["data"].update(dataset=None, config=None, text_columns=["text"], files={"train": "data/own/train.csv"})
    with pytest.raises(ParamsError, match=r"^HEAD:params.yaml: data.files: \{'train': 'data/own/train.csv'\} is set, "
                                          r"but configs/tasks/rte.yaml chooses a dataset \(data.config: rte\); own "
                                          r"files and a dataset can't both be set: set data.files: null in "
                                          r"HEAD:params.yaml$"):
        set_params(load_recipe("rte"), own, own, source="configs/tasks/rte.yaml")


def test_a_bad_seed_is_refused_before_dvc_runs(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit, match=r"^--seeds: train.seed: Input should be greater than or equal to 0 "
                                         r"\(got -1\)$"):
        main(["rte", "--seeds", "-1", "--run"])
    assert capsys.readouterr().out == ""  # no command printed, none run


def test_a_failed_run_exits_with_dvcs_status_without_a_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    fake = tmp_path / "dvc"
    fake.write_text("#!/bin/sh\necho 'ERROR: what dvc says' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SystemExit) as stop:
        main(["rte", "--run"])
    assert stop.value.code == 3


def test_outside_a_repository_the_committed_params_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^HEAD:params.yaml: cannot be read \(fatal: not a git repository"):
        main(["rte"])
