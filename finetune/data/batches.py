"""Every DataLoader of the pipeline: the dynamic-padding collator, shuffled (optionally length-grouped) training
batches and evaluation batches (optionally length-sorted). Dynamic padding follows the Hugging Face course, "A full
training": https://huggingface.co/learn/llm-course/chapter3/4
"""

from __future__ import annotations

import numpy as np
import torch
from datasets import Dataset
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase
from transformers.trainer_pt_utils import LengthGroupedSampler

from finetune.data.tokenization import token_lengths
from finetune.params import EvaluateParams

TEACHER_LOGITS = "teacher_logits"  # with distillation, a train row's teacher logits (finetune/distill/loss.py)


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


def eval_dataloader(ds: Dataset, collator: PairCollator, batch_size: int) -> DataLoader:
    """Evaluation batches of ``ds`` in dataset order; its own generator leaves torch's global RNG (dropout) as is."""
    return DataLoader(ds, batch_size=batch_size, shuffle=False, collate_fn=collator, generator=torch.Generator())


def length_order(lengths: list[int]) -> np.ndarray:
    """Row indices ``[examples]`` of rows of ``lengths`` tokens, shortest first (stable sort): the one place rows are
    sorted by length, for evaluation and inference (``finetune.inference.Predictor``) alike."""
    return np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")


def evaluation_batches(ds: Dataset, collator: PairCollator,
                       p: EvaluateParams) -> tuple[DataLoader, np.ndarray | None]:
    """The evaluation DataLoader of one tokenized split and, with ``p.sort_by_length``, its row order ``[examples]``
    (shortest first; ``outputs[np.argsort(order)]`` puts outputs back in row order), else None (rows in order)."""
    if not p.sort_by_length:
        return eval_dataloader(ds, collator, p.batch_size), None
    order = length_order(token_lengths(ds))
    return eval_dataloader(ds.select(order), collator, p.batch_size), order
