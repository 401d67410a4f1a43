"""tools/augment.py: EDA copies of a pair task's train split, written as own files the pipeline reads."""

import json
import random

import pandas as pd
import pytest

from tools.augment import augment, perturb


def test_perturb_deletes_and_swaps_words_but_keeps_one():
    rng = random.Random(0)
    text = "the quick brown fox jumps over the lazy dog"
    same = perturb(text, rng, p_delete=0.0, swaps=0)
    assert same == text
    swapped = perturb(text, rng, p_delete=0.0, swaps=1)
    assert sorted(swapped.split()) == sorted(text.split()) and swapped != text
    assert len(perturb(text, rng, p_delete=1.0, swaps=0).split()) == 1  # everything deleted: one word kept
    assert perturb("", rng, p_delete=0.5, swaps=1) == ""
    assert perturb(text, random.Random(3), 0.3, 1) == perturb(text, random.Random(3), 0.3, 1)  # seeded


def test_augment_appends_copies_to_train_only(tmp_path):
    source = tmp_path / "pairs"
    source.mkdir()
    rows = {"sentence1": [f"first sentence number {i} here" for i in range(6)],
            "sentence2": [f"second sentence number {i} there" for i in range(6)], "label": [0, 1] * 3, "idx": range(6)}
    for split in ("train", "validation", "test"):
        pd.DataFrame(rows).to_parquet(source / f"{split}.parquet")
    summary = augment(str(source), "default", tmp_path / "out", copies=2, p_delete=0.2, swaps=1, seed=0)
    assert summary["rows"] == {"train": 18, "validation": 6, "test": 6}
    assert json.loads((tmp_path / "out" / "augment.json").read_text()) == summary
    train = pd.read_parquet(tmp_path / "out" / "train.parquet")
    assert list(train["augmented"]) == [0] * 6 + [1] * 12
    assert list(train["label"]) == [0, 1] * 9  # copies keep their pair's label
    assert (train["sentence1"][:6] == rows["sentence1"]).all() and list(train["idx"]) == list(range(18))
    assert pd.read_parquet(tmp_path / "out" / "validation.parquet").equals(pd.read_parquet(source / "validation.parquet"))


def test_augment_refuses_data_without_pairs(tmp_path):
    source = tmp_path / "single"
    source.mkdir()
    pd.DataFrame({"text": ["a b", "c d"], "label": [0, 1]}).to_parquet(source / "train.parquet")
    with pytest.raises(SystemExit, match="not a sentence1/sentence2 pair task"):
        augment(str(source), "default", tmp_path / "out", 1, 0.1, 1, 0)
