"""Evaluation and checkpoints every N optimizer steps (train.eval_every_steps, save_every_steps, save_total_limit):
the best step is kept, patience counts evaluations, a run stopped mid-epoch resumes to the uninterrupted result, old
checkpoints go only after a new one is complete, and a checkpoint that can't be written keeps the previous one.

The tiny project: 40 train rows in batches of 8, 5 optimizer steps an epoch, 2 epochs.
"""

from __future__ import annotations

import errno
import json

import pandas as pd
import pytest
from safetensors.torch import load_file

from finetune.card import training_table
from finetune.errors import CheckpointError
from finetune.train import recipe as training
from finetune.train import resume
from finetune.train.recipe import train
from tests.helpers import interrupt_and_resume, reset_accelerate, squeeze, tiny_params

TIMING_KEYS = {"train_seconds", "samples_per_second", "wall_seconds", "peak_memory_mb", "resumed_from_step"}


def scripted_validation(monkeypatch, values):
    """Validation whose main metric (f1) follows ``values``, one per evaluation; returns the steps it was called at."""
    evaluate_split, values, steps = training.evaluate_split, iter(values), []

    def scripted(predictor, rows, metric, p, desc):
        metrics, logits = evaluate_split(predictor, rows, metric, p, desc)
        return {**metrics, "f1": next(values)}, logits

    monkeypatch.setattr(training, "evaluate_split", scripted)
    return steps


def saved_models(monkeypatch) -> dict[int, dict]:
    """The weights of every model saved as the best so far, by the step it was saved at."""
    save_model, saved = resume.save_model, {}

    def remember(accelerator, model, tokenizer, task, folder):
        weights = {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
        saved[len(saved)] = weights
        return save_model(accelerator, model, tokenizer, task, folder)

    monkeypatch.setattr(resume, "save_model", remember)
    return saved


def evaluation_log(paths) -> pd.DataFrame:
    folder = paths.train_logs / "evaluations" / "plots" / "metrics"
    return pd.read_csv(folder / "validation" / "f1.tsv", sep="\t")


def test_evaluation_every_n_steps_keeps_the_best_step(tiny_project, monkeypatch):
    scripted_validation(monkeypatch, [0.5, 0.9, 0.6, 0.7])  # at steps 3, 6, 9 and the last, 10
    saved = saved_models(monkeypatch)
    params = tiny_params(train={"keep_best": True, "eval_every_steps": 3})
    paths = tiny_project(params=params)
    metrics = train(params, paths)
    assert (metrics["evaluations"], metrics["best_step"], metrics["best_epoch"]) == (4, 6, 2)
    assert metrics["best_validation_f1"] == 0.9 and metrics["steps"] == 10 and not metrics["stopped_early"]
    kept = load_file(paths.trained / "model.safetensors")
    assert len(saved) == 2 and all(kept[k].equal(saved[1][k]) for k in kept)  # saved at steps 3 and 6
    # DVCLive logs by optimizer step, with the epoch in progress; no per-epoch log
    assert evaluation_log(paths)["step"].tolist() == [3, 6, 9, 10]
    epochs = pd.read_csv(paths.train_logs / "evaluations" / "plots" / "metrics" / "epoch.tsv", sep="\t")
    assert epochs["epoch"].tolist() == [1, 2, 2, 2]
    assert not (paths.train_logs / "epochs").exists()
    # the model card's table: a row per evaluation, the kept step marked
    table = squeeze(training_table(paths.train_logs, metrics)).splitlines()
    assert table[0].startswith("| step | epoch | train loss | validation loss |") and len(table) == 2 + 4
    assert table[3].startswith("| 6 | 2 |") and table[3].endswith("| ✓ |")
    # a checkpoint after each evaluation; the newest one kept (save_total_limit 1)
    assert sorted(p.name for p in paths.checkpoints.glob("step-*")) == ["step-10"]


def test_patience_counts_evaluations(tiny_project, monkeypatch):
    scripted_validation(monkeypatch, [0.5, 0.7, 0.6, 0.65, 0.9])
    params = tiny_params(train={"keep_best": True, "eval_every_steps": 2, "early_stopping_patience": 2})
    metrics = train(params, tiny_project(params=params))
    # best at step 4 (the 2nd evaluation), no improvement at steps 6 and 8: stopped there, mid-epoch 2
    assert (metrics["steps"], metrics["evaluations"], metrics["best_step"]) == (8, 4, 4)
    assert metrics["stopped_early"] and metrics["epochs"] == 2


def test_null_step_params_keep_the_per_epoch_run(tiny_project):
    params = tiny_params(train={"keep_best": True})
    paths = tiny_project(params=params)
    metrics = train(params, paths)
    assert (metrics["evaluations"], metrics["best_step"] % 5, metrics["epochs"]) == (2, 0, 2)
    assert not (paths.train_logs / "evaluations").exists()
    f1 = pd.read_csv(paths.train_logs / "epochs" / "plots" / "metrics" / "validation" / "f1.tsv", sep="\t")
    assert f1["step"].tolist() == [1, 2]  # DVCLive's step is the epoch
    assert sorted(p.name for p in paths.checkpoints.glob("step-*")) == ["step-10"]


def test_save_total_limit_keeps_the_newest_checkpoints(tiny_project):
    params = tiny_params(train={"save_every_steps": 2, "save_total_limit": 3})
    paths = tiny_project(params=params)
    train(params, paths)
    # checkpoints at 2, 4, 5 (epoch 1's evaluation), 6, 8, 10: the newest three remain, and the best model apart
    assert sorted(int(p.name.split("-")[1]) for p in paths.checkpoints.glob("step-*")) == [6, 8, 10]
    assert (paths.checkpoints / "best" / "model.safetensors").is_file()
    assert not list(paths.checkpoints.glob(".*.tmp"))


def outcome(paths, metrics: dict):
    weights = load_file(paths.trained / "model.safetensors")
    logs = {str(tsv.relative_to(paths.train_logs)): pd.read_csv(tsv, sep="\t").round(6).to_dict("list")
            for tsv in sorted(paths.train_logs.rglob("*.tsv"))}
    return weights, {k: v for k, v in metrics.items() if k not in TIMING_KEYS}, logs


@pytest.mark.parametrize("settings", [
    {"eval_every_steps": 4},  # stopped after the checkpoint of the evaluation at step 4, mid-epoch 1
    {"save_every_steps": 3, "gradient_accumulation_steps": 2, "batch_size": 4, "group_by_length": True},
], ids=["evaluation-step", "save-step-accumulation"])
def test_a_run_stopped_mid_epoch_resumes_to_the_uninterrupted_result(tiny_project, monkeypatch, settings):
    # dropout: the RNG states must continue too. keep_best false: the weights compared are the last step's, trained
    # after the resume
    params = tiny_params(train={"keep_best": False, "epochs": 3, **settings})
    expected = outcome(*(lambda paths: (paths, train(params, paths)))(tiny_project("whole", params)))
    reset_accelerate()

    paths = tiny_project("stopped", params)
    # stopped at step 7: after the checkpoint at step 4 (evaluation) or 6 (save_every_steps)
    metrics = interrupt_and_resume(params, paths, monkeypatch)
    assert metrics["resumed_from_step"] == (4 if "eval_every_steps" in settings else 6)
    weights, metrics, logs = outcome(paths, metrics)
    assert weights.keys() == expected[0].keys()
    assert all(weights[k].equal(expected[0][k]) for k in weights), "resumed weights differ"
    assert metrics == expected[1]
    assert logs == expected[2]


def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one(tiny_project, monkeypatch):
    params = tiny_params(train={"save_every_steps": 2})
    paths = tiny_project(params=params)
    real, calls = training.Accelerator.save_state, []

    def disk_full_at_the_second(self, output_dir=None, **kwargs):
        calls.append(output_dir)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, output_dir, **kwargs)

    monkeypatch.setattr(training.Accelerator, "save_state", disk_full_at_the_second)
    with pytest.raises(CheckpointError) as error:
        train(params, paths)
    message = str(error.value)
    assert ".step-4.tmp" in message and "the disk is full" in message and "step-2 is kept" in message
    assert [p.name for p in paths.checkpoints.glob("step-*")] == ["step-2"]
    assert not list(paths.checkpoints.glob(".*.tmp")) and not paths.trained.exists()
    state = json.loads((paths.checkpoints / "step-2" / "trainer_state.json").read_text())
    assert state["step"] == 2
