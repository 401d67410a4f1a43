"""The model card (finetune/card.py, the card stage): a tiny model folder and made-up metrics, dvc.lock and git in a
temp project; the card loads with ``ModelCard.load`` and carries eval.json's numbers, the folder still loads with
``pipeline()``, and an error leaves the previous models/finetuned as it was. No training."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pytest
import yaml
from huggingface_hub import ModelCard

from finetune.card import model_card, write_model_folder
from finetune.errors import CheckpointError, PipelineError
from finetune.paths import Paths
from finetune.runtime import write_json
from finetune.tasks import glue_task
from tests.helpers import REPO, python, run, save_collapsed_model, squeeze, tiny_params

MRPC = glue_task("mrpc")
EVALUATION = {
    "validation": {"loss": 0.463, "accuracy": 0.826, "f1": 0.8786, "examples": 408,
                   "baseline": {"class": "equivalent", "share": 0.6838, "accuracy": 0.6838, "f1": 0.8122},
                   "most_predicted": {"class": "equivalent", "share": 0.75}, "collapsed": False},
    "test": {"loss": 0.61, "accuracy": 0.6649, "f1": 0.7987, "examples": 1725,
             "baseline": {"class": "equivalent", "share": 0.6649, "accuracy": 0.6649, "f1": 0.7987},
             "most_predicted": {"class": "equivalent", "share": 1.0}, "collapsed": True},
}
TRAIN = {"steps": 690, "epochs": 3, "best_epoch": 2, "best_validation_f1": 0.8786, "stopped_early": False,
         "train_seconds": 207.8, "samples_per_second": 52.95, "parameters": 22713986, "mixed_precision": "bf16",
         "device": "cpu: AMD EPYC, 2 threads, avx512_bf16"}
EPOCHS = {"train/loss": [0.6225, 0.4981, 0.2713], "validation/loss": [0.5668, 0.4466, 0.4639],
          "validation/accuracy": [0.7721, 0.8113, 0.826], "validation/f1": [0.7974, 0.8597, 0.8786]}


def provenance(checkpoint: str, files: dict) -> dict:
    return {"dataset": {"requested": "nyu-mll/glue", "kind": "local", "location": "../shared/datasets/glue",
                        "revision": None, "files": files, "validation_carved": None,
                        "splits": {"train": {"rows": 3668}}},
            "checkpoint": {"requested": checkpoint, "kind": "local", "location": checkpoint, "revision": None,
                           "files": {"config.json": "c" * 64, "model.safetensors": "a" * 64}}}


def write_lock(root, eval_md5: str) -> None:
    """A dvc.lock whose upstream stages record an output each, evaluate's metrics/eval.json with ``eval_md5``."""
    outs = {"download": "data/raw", "tokenize": "data/tokenized", "collate-check": "metrics/collate_check.json",
            "train": "models/trained"}
    stages = {stage: {"cmd": "x", "outs": [{"path": path, "hash": "md5", "md5": f"{i}" * 32 + ".dir"}]}
              for i, (stage, path) in enumerate(outs.items())}
    stages["evaluate"] = {"cmd": "x", "outs": [{"path": "metrics/eval.json", "hash": "md5", "md5": eval_md5}]}
    (root / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": stages}))


@pytest.fixture
def project(tiny_checkpoint, tmp_path):
    """A project as the card stage finds it: models/trained (a tiny MRPC model), the metrics files, DVCLive's epoch
    log, a dvc.lock matching eval.json, in a git repository with one commit."""
    paths = Paths(tmp_path / "p")
    shutil.copytree(tiny_checkpoint, paths.pretrained)
    save_collapsed_model(paths, MRPC, winner=1)
    params = tiny_params(model={"checkpoint": str(tiny_checkpoint)})
    write_json(paths.metrics / "eval.json", EVALUATION)
    write_json(paths.metrics / "train.json", TRAIN)
    write_json(paths.metrics / "provenance.json", provenance(str(tiny_checkpoint), {"mrpc/train.parquet": "f" * 64}))
    for name, values in EPOCHS.items():
        tsv = paths.train_logs / "epochs" / "plots" / "metrics" / f"{name}.tsv"
        tsv.parent.mkdir(parents=True, exist_ok=True)
        tsv.write_text("step\t" + name.split("/")[1] + "\n" + "".join(f"{i}\t{v}\n" for i, v in enumerate(values, 1)))
    write_lock(paths.root, hashlib.md5((paths.metrics / "eval.json").read_bytes()).hexdigest())
    (paths.root / ".gitignore").write_text("/models/\n")  # DVC's outputs are git-ignored
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "run"]):
        run(cmd, paths.root)
    return paths, params


def test_the_card_carries_the_metrics_epochs_and_provenance_and_the_folder_still_loads(project, tiny_checkpoint):
    paths, params = project
    tokenizer_config = paths.trained / "tokenizer_config.json"  # trained with a truncation of 48 tokens
    tokenizer_config.write_text(json.dumps({**json.loads(tokenizer_config.read_text()), "model_max_length": 48}))
    write_model_folder(paths.trained, paths.finetuned, model_card(params, paths))

    card = ModelCard.load(paths.finetuned / "README.md")
    assert card.data.base_model == str(tiny_checkpoint)
    assert card.data.datasets == ["nyu-mll/glue"] and card.data.language == "en"
    results = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert results == {(split, metric): EVALUATION[split][metric]
                       for split in EVALUATION for metric in ("f1", "accuracy")}
    assert {(r.dataset_type, r.dataset_config, r.task_type) for r in card.data.eval_results} == {
        ("nyu-mll/glue", "mrpc", "text-classification")}
    text = squeeze(card.text)
    assert "0 `not_equivalent`, 1 `equivalent`" in text  # the label names
    assert "| 2 | 0.4981 | 0.4466 | 0.8113 | 0.8597 | ✓ |" in text  # the kept epoch of the per-epoch table
    commit = run(["git", "rev-parse", "HEAD"], paths.root).strip()
    assert f"git commit `{commit}`" in text and "no uncommitted changes" in text
    assert "| train | `models/trained` | `33333333333333333333333333333333.dir` |" in text
    assert "matches the files the card was written from" in text
    assert "`cpu: AMD EPYC, 2 threads, avx512_bf16`, mixed precision `bf16`" in text
    assert "**Warning: the model looks collapsed on test**" in text
    assert "collapsed on validation" not in text
    assert "Texts are truncated at 48 tokens (the pair together)" in text
    assert "{{" not in text and "{%" not in text  # the template is filled in

    # The folder is the model's, plus its card: pipeline() loads it and predicts a label name.
    assert {p.name for p in paths.trained.iterdir()} | {"README.md"} == {p.name for p in paths.finetuned.iterdir()}
    from transformers import pipeline

    [result] = pipeline("text-classification", model=str(paths.finetuned))(
        [{"text": "The court rejected the appeal.", "text_pair": "The appeal was rejected by the court."}])
    assert result["label"] == "equivalent"


def test_without_dvc_lock_and_git_the_card_says_so(project):
    paths, params = project
    (paths.root / "dvc.lock").unlink()
    text = model_card(params, paths).text
    assert "There is no dvc.lock" in text
    write_lock(paths.root, "0" * 32)  # of another run
    (paths.root / "params.yaml").write_text("changed after the commit\n")
    text = model_card(params, paths).text
    assert "dvc.lock's md5 of metrics/eval.json differs from the file read" in text
    assert "with uncommitted changes to params.yaml" in text
    shutil.rmtree(paths.root / ".git")
    assert "git commit `unknown` (no git repository found)" in model_card(params, paths).text


def test_own_data_results_name_the_files_and_their_sha256(project):
    paths, params = project
    params = tiny_params(model=params.model.model_dump(), data={
        "dataset": None, "config": None, "files": {"train": "data/own/a/train.csv"},
        "text_columns": ["sentence1", "sentence2"]})
    own = provenance(params.model.checkpoint, {"data/own/a/train.csv": "1" * 64})
    own["dataset"]["validation_carved"] = {"from": "train", "fraction": 0.1, "seed": 42, "stratified": True, "rows": 5}
    write_json(paths.metrics / "provenance.json", own)
    write_json(paths.metrics / "eval.json", {"validation": EVALUATION["validation"]})
    card = model_card(params, paths)
    [result] = [r for r in card.data.eval_results if r.metric_type == "f1"]
    assert (result.dataset_split, result.dataset_type, result.dataset_revision) == (
        "validation", "data/own/a/train.csv", "1" * 64)
    assert result.dataset_name == "own data: data/own/a/train.csv (carved from train)"
    assert card.data.datasets is None and card.data.language is None
    assert f"| `data/own/a/train.csv` | `{'1' * 64}` |" in squeeze(card.text)
    assert "validation carved from train (5 rows, seed 42)" in card.text


def test_an_error_leaves_the_previous_folder_as_it_was(project, monkeypatch):
    paths, params = project
    paths.finetuned.mkdir(parents=True)
    (paths.finetuned / "previous.txt").write_text("the last run's")
    card = model_card(params, paths)

    def fail(self, path):
        raise OSError("disk full")

    monkeypatch.setattr(ModelCard, "save", fail)  # after the model files were copied
    with pytest.raises(OSError, match="disk full"):
        write_model_folder(paths.trained, paths.finetuned, card)
    assert [p.name for p in paths.finetuned.iterdir()] == ["previous.txt"]
    assert not list(paths.finetuned.parent.glob(".finetuned.*.tmp"))


def test_a_missing_metrics_file_is_one_message(project):
    paths, params = project
    (paths.metrics / "eval.json").unlink()
    with pytest.raises(PipelineError, match=r"metrics/eval.json: not found; run the stages before the card stage"):
        model_card(params, paths)


@pytest.mark.parametrize("file,content,message", [
    ("model.safetensors", None, "no model weights (one of model.safetensors"),
    ("config.json", '{"model_type": "bert",', "config.json: cannot be read ("),
    ("config.json", "[1]", "config.json: cannot be read (a JSON list, not an object)"),
], ids=["no-weights", "invalid-config", "config-not-an-object"])
def test_a_trained_folder_the_card_cant_copy_is_one_line(project, file, content, message):
    # the card stage checks models/trained without torch (finetune/checkpoint_files.py), and as clearly
    paths, params = project
    if content is None:
        (paths.trained / file).unlink()
    else:
        (paths.trained / file).write_text(content)
    with pytest.raises(CheckpointError, match=re.escape(message)) as err:
        model_card(params, paths)
    assert "\n" not in str(err.value)


def test_the_card_stage_lists_its_template():
    # finetune/code.py follows .py files only: the template is listed by hand.
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["card"]
    assert "finetune/model_card.md.j2" in stage["deps"] and stage["outs"] == ["models/finetuned"]
    assert {"models/trained", "dvclive/train", "metrics/eval.json", "metrics/train.json",
            "metrics/provenance.json"} <= set(stage["deps"])


def test_the_card_stage_imports_no_torch():
    # It only copies the folder and writes its card: the checkpoint is checked by finetune/checkpoint_files.py.
    code = "import sys, stages.card; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    assert run(python("-c", code), REPO).strip().splitlines()[-1] == "[]"
