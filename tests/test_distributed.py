"""The distributed path on CPU: with a 2-process accelerate config the train and evaluate stages hand themselves over
to `accelerate launch`; 2 processes train, and evaluate to the same metrics as one process on the same weights, also
when a split does not divide by the global batch."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from finetune.evaluate.predictions import evaluate_model
from tests.helpers import REPO, make_project, python, run, tiny_params

CPU_2PROC = REPO / "configs" / "accelerate" / "cpu_2proc.yaml"
# validation has 21 rows, test 19: neither divides by the global batch of 2 processes x 4
PARAMS = tiny_params(train={"seed": 5, "batch_size": 4, "warmup_steps": 0, "accelerate_config": str(CPU_2PROC),
                            "num_threads": 1},
                     evaluate={"batch_size": 4, "sort_by_length": True, "splits": ["validation", "test"]})


@pytest.fixture(scope="module")
def paths(tiny_raw, tiny_checkpoint, tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("distributed") / "p", PARAMS, tiny_raw, tiny_checkpoint)


def test_two_processes_train_with_a_shared_schedule(paths):
    output = run(python("-m", "stages.train"), paths.root)  # train.accelerate_config: CPU_2PROC
    assert "on 2 process(es)" in output
    metrics = json.loads((paths.root / "metrics" / "train.json").read_text())
    # 40 rows, 10 batches of 4, split over 2 processes: 5 optimizer steps an epoch, taken by both together
    assert (metrics["steps"], metrics["epochs"]) == (10, 2)
    assert metrics["train_samples"] == 2 * 10 * 4
    assert (paths.trained / "model.safetensors").is_file()


def test_two_processes_evaluate_like_one(paths):
    if not paths.trained.is_dir():
        pytest.skip("needs the model of test_two_processes_train_with_a_shared_schedule")
    run(python("-m", "stages.evaluate"), paths.root)  # 2 processes
    two = json.loads((paths.root / "metrics" / "eval.json").read_text())
    two_predictions = {s: pd.read_csv(paths.predictions / f"{s}.csv") for s in ("validation", "test")}
    one = evaluate_model(PARAMS, paths)  # one process: this one

    for split, examples in (("validation", 21), ("test", 19)):
        assert two[split]["examples"] == one[split]["examples"] == examples  # each row counted once
        assert (two[split]["accuracy"], two[split]["f1"]) == (one[split]["accuracy"], one[split]["f1"])
        assert two[split]["loss"] == pytest.approx(one[split]["loss"], abs=1e-4)
        predictions = pd.read_csv(paths.predictions / f"{split}.csv")
        assert predictions["idx"].tolist() == list(range(examples))
        assert predictions["prediction"].tolist() == two_predictions[split]["prediction"].tolist()


def test_the_stages_hand_over_before_importing_torch():
    # The process that only starts `accelerate launch` imports no torch, transformers or datasets (about 4 s).
    code = ("import sys, stages.train, stages.evaluate; "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))")
    assert run(python("-c", code), REPO).strip().splitlines()[-1] == "[]"
