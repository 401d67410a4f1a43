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

from finetune.params import EvaluateParams
from finetune.tokenization import SWAPPED, token_lengths

TEACHER_LOGITS = "teacher_logits"  # a train row's teacher logits, with distillation (finetune.distill)


class PairCollator:
    """Dynamic padding (``DataCollatorWithPadding``: each batch padded to its longest sequence, with the
    tokenizer's pad id, on the right), after picking the order of each pair.

    Rows of a symmetric pair task carry both orders (``finetune.tokenization.tokenize`` with ``swapped``). Each row is
    swapped with probability ``swap``: 0 keeps the first order (s1, s2), 1 takes (s2, s1) for every row, 0.5 draws
    the order per row from ``generator`` (reseed it to replay a draw). The unused order's columns are dropped;
    rows without swapped columns pass as they are.

    With distillation the train rows carry the teacher's logits (``TEACHER_LOGITS``, and ``SWAPPED`` +
    ``TEACHER_LOGITS`` of the other order: ``finetune.distill.with_teacher_logits``): the picked order's are stacked
    as ``teacher_logits``, a float32 tensor ``[batch, num_labels]``.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, swap: float = 0.0, seed: int = 0):
        self.pad = DataCollatorWithPadding(tokenizer=tokenizer)
        self.swap = swap
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        swapped = torch.rand(len(features), generator=self.generator) < self.swap if 0 < self.swap < 1 else \
            [self.swap >= 1] * len(features)
        rows = []
        for row, use_swapped in zip(features, swapped):
            kept = {k: v for k, v in row.items() if not k.startswith(SWAPPED)}
            if use_swapped:
                kept.update({k.removeprefix(SWAPPED): v for k, v in row.items() if k.startswith(SWAPPED)})
            rows.append(kept)
        teacher = [row.pop(TEACHER_LOGITS) for row in rows] if rows and TEACHER_LOGITS in rows[0] else None
        batch = self.pad(rows)
        if teacher is not None:
            batch[TEACHER_LOGITS] = torch.tensor(teacher, dtype=torch.float32)
        return batch

    def skip(self, batches: int, batch_size: int) -> None:
        """Draw the orders of ``batches`` batches of ``batch_size`` rows without collating them: a run resumed
        mid-epoch skips the batches taken before its checkpoint, and the rest of the epoch then gets the orders an
        uninterrupted run gives it. (The generator's state can't simply be checkpointed: accelerate's DataLoader
        collates one batch ahead, so at a checkpoint the next batch's orders are already drawn.)"""
        if 0 < self.swap < 1:
            for _ in range(batches):
                torch.rand(batch_size, generator=self.generator)


def make_collator(tokenizer: PreTrainedTokenizerBase, swap: float = 0.0, seed: int = 0) -> PairCollator:
    """The collator of every DataLoader: dynamic padding, pairs in their first order (``swap`` 0), swapped (1)
    or in a random order per row (0.5), see ``PairCollator``."""
    return PairCollator(tokenizer, swap, seed)


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


def evaluation_batches(ds: Dataset, collator: PairCollator,
                       p: EvaluateParams) -> tuple[DataLoader, np.ndarray | None]:
    """The evaluation DataLoader of one tokenized split and the row order it follows.

    With ``p.sort_by_length`` the rows go shortest first (little padding) and ``order`` ``[examples]`` is returned:
    put outputs back in row order with ``outputs[np.argsort(order)]``. Otherwise rows keep their order and
    ``order`` is None.
    """
    if not p.sort_by_length:
        return eval_dataloader(ds, collator, p.batch_size), None
    order = np.argsort(np.asarray(token_lengths(ds)), kind="stable")
    return eval_dataloader(ds.select(order), collator, p.batch_size), order


def evaluation_loaders(ds: Dataset, tokenizer: PreTrainedTokenizerBase, p: EvaluateParams,
                       both_orders: bool = False) -> tuple[list[DataLoader], np.ndarray | None]:
    """``evaluation_batches`` of one split: one DataLoader, or with ``both_orders`` (a model trained with
    ``train.swap_pairs``) two over the same rows in the same order, the pairs as given and swapped; the caller
    averages their outputs (``finetune.evaluation.evaluate_split``)."""
    loader, order = evaluation_batches(ds, make_collator(tokenizer), p)
    if not both_orders:
        return [loader], order
    return [loader, evaluation_batches(ds, make_collator(tokenizer, swap=1.0), p)[0]], order
