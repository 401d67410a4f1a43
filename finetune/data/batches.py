"""Every DataLoader of the pipeline: dynamic padding, training batches (length-grouped) and evaluation batches
(length-sorted, predictions put back in row order).

Dynamic padding as in the Hugging Face course, chapter 3 "A full training":
https://huggingface.co/learn/llm-course/chapter3/4
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
    """Dynamic padding (``DataCollatorWithPadding``: each batch padded to its longest sequence, with the tokenizer's
    pad id, on the right).

    With distillation the train rows carry the teacher's logits (``TEACHER_LOGITS``:
    ``finetune.distill.loss.with_teacher_logits``): they are stacked as ``teacher_logits``, a float32 tensor
    ``[batch, num_labels]``.
    """

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
    """The collator of every DataLoader: dynamic padding, see ``PairCollator``."""
    return PairCollator(tokenizer)


def train_dataloader(ds: Dataset, collator: PairCollator, batch_size: int, seed: int,
                     group_by_length: bool = False) -> DataLoader:
    """Shuffled training batches; the order depends on ``seed`` only (reseed ``loader.generator`` to change it).

    With ``group_by_length``, transformers' ``LengthGroupedSampler`` shuffles the rows, cuts them into chunks
    of up to 50 batches and sorts each chunk by length, so a batch holds sequences of similar length and
    dynamic padding adds little (the course's random batches pad about a quarter of all tokens on MRPC).

    Each batch is a dict of tensors ``[batch, seq_len]`` (``labels``: ``[batch]``; with distillation
    ``teacher_logits``: ``[batch, num_labels]``).
    """
    generator = torch.Generator().manual_seed(seed)
    if group_by_length:
        sampler = LengthGroupedSampler(batch_size, lengths=token_lengths(ds), generator=generator)
        return DataLoader(ds, batch_size=batch_size, sampler=sampler, collate_fn=collator, generator=generator)
    return DataLoader(ds, batch_size=batch_size, shuffle=True, collate_fn=collator, generator=generator)


def eval_dataloader(ds: Dataset, collator: PairCollator, batch_size: int) -> DataLoader:
    """Evaluation batches in dataset order.

    The loader has its own generator: without one, every ``iter(loader)`` draws a seed from torch's global
    RNG, so validating between epochs would change the dropout masks of the epochs after it.
    """
    return DataLoader(ds, batch_size=batch_size, shuffle=False, collate_fn=collator, generator=torch.Generator())


def length_order(ds: Dataset) -> np.ndarray:
    """Row indices ``[examples]``, shortest first (stable): ``ds.select(order)`` batches with little padding."""
    return np.argsort(np.asarray(token_lengths(ds)), kind="stable")


def evaluation_batches(ds: Dataset, collator: PairCollator,
                       p: EvaluateParams) -> tuple[DataLoader, np.ndarray | None]:
    """The evaluation DataLoader of one tokenized split and the row order it follows.

    With ``p.sort_by_length`` the rows go shortest first (little padding) and ``order`` ``[examples]`` is returned:
    put outputs back in row order with ``outputs[np.argsort(order)]``. Otherwise rows keep their order and
    ``order`` is None.
    """
    if not p.sort_by_length:
        return eval_dataloader(ds, collator, p.batch_size), None
    order = length_order(ds)
    return eval_dataloader(ds.select(order), collator, p.batch_size), order


def evaluation_loader(ds: Dataset, tokenizer: PreTrainedTokenizerBase,
                      p: EvaluateParams) -> tuple[DataLoader, np.ndarray | None]:
    """``evaluation_batches`` of one tokenized split with the dynamic-padding collator of ``tokenizer``."""
    return evaluation_batches(ds, make_collator(tokenizer), p)
