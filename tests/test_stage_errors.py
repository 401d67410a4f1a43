"""Expected errors (bad params, data, checkpoint) stop a stage with their message alone and a non-zero exit; a bug
keeps its traceback. The stages' ``main`` run as `python -m stages.<name>` runs them (``finetune.runtime.run_stage``),
in this process; the same as a command under dvc: tests/test_pipeline_e2e.py,
test_bad_param_stops_the_stage_with_one_message."""

from __future__ import annotations

import signal
from importlib import import_module

import pytest

from finetune.runtime import run_stage
from tests.helpers import REPO, make_project, python, run, tiny_params, write_hub_folder


@pytest.fixture
def stage_in(monkeypatch):
    """Run a stage's ``main`` in a project folder as its command does; SIGTERM's handler is put back afterwards."""
    def run_in(root, name: str) -> None:
        monkeypatch.chdir(root)
        run_stage(import_module(f"stages.{name}").main)

    sigterm = signal.getsignal(signal.SIGTERM)
    yield run_in
    signal.signal(signal.SIGTERM, sigterm)


def test_bad_params_are_named_in_one_line(tmp_path):
    project = make_project(tmp_path / "p", tiny_params())
    text = (project.root / "params.yaml").read_text().replace("lr: 0.001", "lr: -1")
    (project.root / "params.yaml").write_text(text)
    # `python -m finetune.params` checks params.yaml alone; the stages check it first
    assert run(python("-m", "finetune.params"), project.root, ok=False).strip() == \
        "params.yaml: train.lr: Input should be greater than 0 (got -1)"


def test_bad_data_prints_one_message(tiny_raw, tmp_path, stage_in):
    splits = {split: ds.to_pandas() for split, ds in tiny_raw.items()}
    splits["train"].loc[5, "label"] = 2
    folder = write_hub_folder(tmp_path / "glue", splits)
    project = make_project(tmp_path / "p", tiny_params(data={"dataset": str(folder), "local_copy": None}))
    with pytest.raises(SystemExit) as stopped:  # a SystemExit with a message: Python prints it alone, exit status 1
        stage_in(project.root, "download")
    assert stopped.value.code.startswith(f"ERROR: {folder}: split 'train' row idx=5: label 2 not in [0, 1]")
    assert not project.raw.exists()


def test_bad_checkpoint_prints_one_message(tiny_raw, tiny_checkpoint, tmp_path, stage_in):
    project = make_project(tmp_path / "p", tiny_params(), tiny_raw, tiny_checkpoint)
    (project.pretrained / "model.safetensors").unlink()
    with pytest.raises(SystemExit) as stopped:
        stage_in(project.root, "train")
    assert str(stopped.value.code).startswith("ERROR: models/pretrained: no model weights (one of model.safetensors")
    assert not project.trained.exists()


def test_a_bug_keeps_its_traceback(tmp_path, stage_in):
    # Missing input artifacts are not an expected error of the stage (DVC provides them): the exception (here the
    # tokenizer's OSError for models/pretrained) goes on instead of a one-line exit, so Python prints its traceback.
    project = make_project(tmp_path / "p", tiny_params())
    with pytest.raises(OSError):
        stage_in(project.root, "tokenize")


def test_every_stage_command_runs_its_main_through_run_stage():
    # The tests above run a stage's main through run_stage in this process; `python -m stages.<name>` must do the same.
    for script in sorted((REPO / "stages").glob("*.py")):
        if script.name != "__init__.py":
            assert script.read_text().rstrip().endswith('if __name__ == "__main__":\n    run_stage(main)'), script.name
