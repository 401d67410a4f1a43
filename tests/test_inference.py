"""The one inference path (finetune/inference): a model folder opened once, rows scored in their order whatever the
batching, answers as tools.predict writes them, one-line errors for a folder that can't be opened, and no other
module that opens a model folder or sorts rows by length."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from finetune.data.batches import row_buckets
from finetune.errors import CheckpointError
from finetune.inference.predictor import Predictor, answers, with_predictions
from finetune.tasks import glue_task, own_task
from tests.helpers import REPO

PAIRS = [("The cat sat on the mat.", "A cat was sitting on the mat."), ("He won.", "He lost."),
         ("Shares fell sharply on Monday after the company warned about its profits.", "The court rejected it."),
         ("Yes.", "No.")]


@pytest.fixture(scope="module")
def predictor(tiny_finetuned) -> Predictor:
    return Predictor.open(tiny_finetuned)


def test_logits_come_back_in_row_order_whatever_the_batching(predictor):
    alone = torch.cat([predictor.logits([pair], batch_size=1) for pair in PAIRS])
    assert alone.shape == (len(PAIRS), predictor.task.num_labels) and alone.dtype == torch.float32
    for options in ({"batch_size": 4}, {"batch_size": 3, "sort_by_length": False},
                    {"batch_size": 3, "pad_to_multiple_of": 16, "fill_rows": True}):
        assert torch.allclose(predictor.logits(PAIRS, **options), alone, atol=1e-5), options
    encoded = predictor.encode(PAIRS)  # token ids score as their texts do
    assert set(encoded) >= {"input_ids", "attention_mask"} and len(encoded["input_ids"]) == len(PAIRS)
    assert torch.allclose(predictor.logits(encoded, batch_size=2), alone, atol=1e-5)
    assert predictor.logits([], batch_size=2).shape == (0, predictor.task.num_labels)


def test_opening_a_folder_reads_its_config_once(tiny_finetuned, monkeypatch):
    from transformers import PretrainedConfig

    reads, read = [], PretrainedConfig._dict_from_json_file.__func__
    monkeypatch.setattr(PretrainedConfig, "_dict_from_json_file",
                        classmethod(lambda cls, file: reads.append(Path(file).name) or read(cls, file)))
    predictor = Predictor.open(tiny_finetuned)
    assert reads == ["config.json"]
    assert predictor.max_length == 32  # the truncation it was trained with, carried by its tokenizer


def test_rows_are_filled_up_to_few_batch_sizes():
    assert row_buckets(32) == [1, 2, 4, 8, 16, 24, 32] and row_buckets(3) == [1, 2, 3] and row_buckets(1) == [1]


def test_answers_are_the_records_of_the_predictions_table():
    mrpc, logits = glue_task("mrpc"), torch.tensor([[2.0, -1.0], [0.1, 0.3]])
    got = answers(logits, mrpc)
    table = with_predictions(pd.DataFrame(index=range(2)), logits, mrpc)
    assert [a["label"] for a in got] == table["prediction"].tolist() == ["not_equivalent", "equivalent"]
    assert [a["probabilities"]["equivalent"] for a in got] == pytest.approx(table["probability_equivalent"].tolist())
    assert got[0]["probabilities"] == {"not_equivalent": 0.95257, "equivalent": 0.04743}
    regression = own_task(("text",), None)
    assert answers(torch.tensor([[0.123456], [2.0]]), regression) == [{"score": 0.12346}, {"score": 2.0}]


def test_a_folder_that_cant_be_opened_says_so_in_one_line(tiny_finetuned, tmp_path):
    with pytest.raises(CheckpointError, match=r"none: model folder not found$"):
        Predictor.open(tmp_path / "none")
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_finetuned, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a truncated download
    with pytest.raises(CheckpointError, match=r"damaged/model.safetensors: cannot be read \(.*\); the checkpoint is "
                                              r"damaged: save or copy it again$") as error:
        Predictor.open(damaged)
    assert "\n" not in str(error.value)
    (damaged / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"damaged/config.json: cannot be read") as error:
        Predictor.open(damaged)
    assert "\n" not in str(error.value)


# Where a model folder may be opened and rows sorted by length; anywhere else is a second inference path.
OPENERS = {"load_finetuned", "load_form", "InferenceSession", "compile_model"}
ALLOWED = {
    "finetune/inference/predictor.py": OPENERS,  # the core
    "finetune/inference/runtimes.py": OPENERS,  # each form's runtime, which the core opens
    "finetune/modeling.py": {"load_finetuned"},  # defines it
    "finetune/export/registry.py": {"load_form"},  # defines it: a form's loader, for the bare reference server
    "benchmarks/load_bare.py": {"load_form"},  # BareAPI: the engine's bare ceiling, on purpose without the core
    "benchmarks/machine.py": {"InferenceSession"},  # an int8 matmul of its own, the machine's ceiling
    "finetune/data/batches.py": {"argsort"},  # length_order: the one sort by length
}


def test_no_other_module_opens_a_model_folder_or_sorts_rows_by_length():
    found = []
    for path in sorted(p for package in ("finetune", "stages", "tools", "benchmarks")
                       for p in (REPO / package).rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if called in OPENERS | {"argsort"} and called not in ALLOWED.get(name, set()):
                    found.append(f"{name}:{node.lineno} {called}")
    assert found == []


def test_the_allowed_places_exist():
    assert all(Path(REPO / name).is_file() for name in ALLOWED)
