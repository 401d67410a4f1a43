"""Every DataLoader of the pipeline: the dynamic-padding collator and shuffled (optionally length-grouped) training
batches; the batches a model scores rows in (``scoring_batches``: evaluation, the export stage, the teacher and the
tools, through ``finetune.inference.predictor.Predictor``), sorted by length and padded as the tokenizer pads.
Dynamic padding follows the Hugging Face course, "A full training": https://huggingface.co/learn/llm-course/chapter3/4
"""

from __future__ import annotations

import numpy as np
import torch
from datasets import Dataset
from torch.utils.data import DataLoader, Subset
from transformers import BatchEncoding, DataCollatorWithPadding, PreTrainedTokenizerBase
from transformers.trainer_pt_utils import LengthGroupedSampler

from finetune.data.tokenization import token_lengths

TEACHER_LOGITS = "teacher_logits"  # with distillation, a train row's teacher logits (finetune/distill/loss.py)
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what a classifier reads, in ONNX's input order


class PairCollator:
    """Dynamic padding: each batch padded on the right to its longest sequence with the tokenizer's pad id
    (``DataCollatorWithPadding``). Rows that carry ``TEACHER_LOGITS`` (distillation) get them stacked as
    ``teacher_logits``, float32 ``[batch, num_labels]``."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.pad = DataCollatorWithPadding(tokenizer=tokenizer)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        rows = [dict(row) for row in features]
        teacher = [row.pop(TEACHER_LOGITS) for row in rows] if rows and TEACHER_LOGITS in rows[0] else None
        batch = self.pad(rows)
        if teacher is not None:
            batch[TEACHER_LOGITS] = torch.tensor(teacher, dtype=torch.float32)
        return batch


def make_collator(tokenizer: PreTrainedTokenizerBase) -> PairCollator:
    """The collator of every DataLoader: ``PairCollator(tokenizer)``."""
    return PairCollator(tokenizer)


def train_dataloader(ds: Dataset, collator: PairCollator, batch_size: int, seed: int,
                     group_by_length: bool = False) -> DataLoader:
    """Shuffled training batches, in an order fixed by ``seed`` (reseed ``loader.generator`` to change it): tensors
    ``[batch, seq_len]``, ``labels`` ``[batch]`` and, with distillation, ``teacher_logits`` ``[batch, num_labels]``.
    ``group_by_length``: batches of similar length (transformers' ``LengthGroupedSampler``: shuffled, cut into chunks of
    up to 50 batches, each chunk sorted by length)."""
    generator = torch.Generator().manual_seed(seed)
    if group_by_length:
        sampler = LengthGroupedSampler(batch_size, lengths=token_lengths(ds), generator=generator)
        return DataLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=collator, generator=generator)
    return DataLoader(ds, batch_size=batch_size, shuffle=True, collate_fn=collator, generator=generator)


def length_order(lengths: list[int]) -> np.ndarray:
    """Row indices ``[examples]`` of rows of ``lengths`` tokens, shortest first (stable sort): the one place rows are
    sorted by length, for evaluation and inference (``finetune.inference.predictor.Predictor``) alike."""
    return np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")


class TokenRows(torch.utils.data.Dataset):
    """Rows of token ids to score, each ``{name: ids}`` for those of ``MODEL_INPUTS`` present (labels and other
    columns left out), from a tokenized split or a dict of lists (a tokenizer's unpadded output)."""

    def __init__(self, rows: Dataset | dict[str, list]):
        if isinstance(rows, dict):
            self.columns, self.dataset = {k: v for k, v in rows.items() if k in MODEL_INPUTS}, None
        else:
            self.columns, self.dataset = None, rows.select_columns([c for c in MODEL_INPUTS if c in rows.column_names])

    def __len__(self) -> int:
        return len(self.dataset) if self.dataset is not None else len(self.columns["input_ids"])

    def __getitem__(self, i: int) -> dict:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[dict]:
        if self.dataset is not None:
            return self.dataset.__getitems__(indices)
        return [{name: values[i] for name, values in self.columns.items()} for i in indices]

    def lengths(self) -> list[int]:
        """Tokens per row, special tokens included, in row order."""
        if self.dataset is not None:
            return token_lengths(self.dataset)
        return [len(ids) for ids in self.columns["input_ids"]]


def row_buckets(max_rows: int) -> list[int]:
    """The row counts a scoring batch is filled up to (``fill_rows``): 1, 2, 4, 8, then multiples of 8, and
    ``max_rows``."""
    sizes = [size for size in (1, 2, 4) if size < max_rows] + list(range(8, max_rows, 8))
    return [*sizes, max_rows]


def bucket(rows: int, max_rows: int) -> int:
    """The smallest of ``row_buckets(max_rows)`` that holds ``rows``."""
    return next(size for size in row_buckets(max_rows) if size >= rows)


class ScoringCollator:
    """A scoring batch: rows of ``TokenRows`` padded as the tokenizer pads (``PreTrainedTokenizerBase.pad``: its pad
    id, on its side, to the longest row or to a multiple of ``pad_to_multiple_of`` tokens), after, with
    ``fill_rows``, filling the rows up to ``bucket(rows, batch_size)`` with copies of the last one (so a runtime that
    compiles each shape meets few). Returns ``(batch, rows)``: tensors ``[rows filled, seq_len]``, and how many of
    its rows, first, are real."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, batch_size: int, pad_to_multiple_of: int | None = None,
                 fill_rows: bool = False):
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.pad_to_multiple_of, self.fill_rows = pad_to_multiple_of, fill_rows

    def __call__(self, rows: list[dict]) -> tuple[BatchEncoding, int]:
        size = len(rows)
        if self.fill_rows:
            rows = rows + rows[-1:] * (bucket(size, self.batch_size) - size)
        return self.tokenizer.pad(rows, padding=True, pad_to_multiple_of=self.pad_to_multiple_of,
                                  return_tensors="pt"), size


def scoring_batches(rows: TokenRows, tokenizer: PreTrainedTokenizerBase, batch_size: int, *,
                    sort_by_length: bool = True, pad_to_multiple_of: int | None = None,
                    fill_rows: bool = False) -> DataLoader:
    """The batches a model scores ``rows`` in (``finetune.inference.predictor.Predictor.logits``): ``batch_size``
    rows each, shortest first (``length_order``) with ``sort_by_length`` when the rows fill more than one batch
    (one batch is padded to its longest row in any order), collated by ``ScoringCollator``. The loader's dataset is
    ``Subset(rows, order)``: ``loader.dataset.indices`` is the row order the outputs come in. Its own generator
    leaves torch's global RNG (training's dropout) as it is."""
    order = length_order(rows.lengths()) if sort_by_length and len(rows) > batch_size else np.arange(len(rows))
    return DataLoader(Subset(rows, order.tolist()), batch_size=batch_size, generator=torch.Generator(),
                      collate_fn=ScoringCollator(tokenizer, batch_size, pad_to_multiple_of, fill_rows))
