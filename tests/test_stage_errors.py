"""Expected errors (bad params, data, checkpoint) stop a stage with their message alone and a non-zero exit; a bug
keeps its traceback. Run as a user runs the stages: as commands (`python -m stages.<name>`, as dvc.yaml does)."""

from __future__ import annotations

from tests.helpers import make_project, python, run, tiny_params, write_hub_folder


def no_traceback(output: str) -> None:
    assert "Traceback" not in output and "CalledProcessError" not in output, output[-3000:]


def test_bad_params_are_named_in_one_line(tmp_path):
    project = make_project(tmp_path / "p", tiny_params())
    text = (project.root / "params.yaml").read_text().replace("lr: 0.001", "lr: -1")
    (project.root / "params.yaml").write_text(text)
    # `python -m finetune.params` checks params.yaml alone; the stages check it first (through dvc:
    # tests/test_pipeline_e2e.py, test_bad_param_stops_the_stage_with_one_message)
    assert run(python("-m", "finetune.params"), project.root, ok=False).strip() == \
        "params.yaml: train.lr: Input should be greater than 0 (got -1)"


def test_bad_data_prints_one_message(tiny_raw, tmp_path):
    splits = {split: ds.to_pandas() for split, ds in tiny_raw.items()}
    splits["train"].loc[5, "label"] = 2
    folder = write_hub_folder(tmp_path / "glue", splits)
    project = make_project(tmp_path / "p", tiny_params(data={"dataset": str(folder), "local_copy": None}))
    output = run(python("-m", "stages.download"), project.root, ok=False)
    assert f"ERROR: {folder}: split 'train' row idx=5: label 2 not in [0, 1]" in output
    no_traceback(output)
    assert not project.raw.exists()


def test_bad_checkpoint_prints_one_message(tiny_raw, tiny_checkpoint, tmp_path):
    project = make_project(tmp_path / "p", tiny_params(), tiny_raw, tiny_checkpoint)
    (project.pretrained / "model.safetensors").unlink()
    output = run(python("-m", "stages.train"), project.root, ok=False)
    assert "ERROR: models/pretrained: no model weights (one of model.safetensors" in output
    no_traceback(output)
    assert not project.trained.exists()


def test_a_bug_keeps_its_traceback(tmp_path):
    # A missing input artifact is not an expected error of the stage (DVC provides it): the traceback says where.
    project = make_project(tmp_path / "p", tiny_params())
    output = run(python("-m", "stages.tokenize"), project.root, ok=False)
    assert "Traceback" in output
