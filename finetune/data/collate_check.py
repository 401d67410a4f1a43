"""The rules a collated batch obeys, checked on the batches that training and evaluation use (``finetune.data.batches``:
``train_dataloader``, and ``scoring_batches``, which ``finetune.inference.predictor.Predictor`` scores a split in):
keys, shapes ``[batch, seq_len]``, dynamic right padding with the pad id, no empty sequence, labels in range (an
evaluated split's as evaluation reads them, beside its batches); then one forward pass of the pretrained model. A
split of up to ``MAX_CHECKED_BATCHES`` batches is checked whole, a larger one in a sample (``batches_to_check``);
padding and length statistics cover every batch. A broken rule raises a ``CollateError`` naming the split, the batch
and the rule."""

from __future__ import annotations

import logging
import random

import torch
from datasets import load_from_disk
from torch.utils.data import DataLoader, Subset
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from finetune.data.batches import TokenRows, make_collator, scoring_batches, train_dataloader
from finetune.data.prepare import is_labeled, present_splits
from finetune.data.tokenization import token_lengths
from finetune.errors import CollateError
from finetune.modeling import load_classifier
from finetune.params import Params
from finetune.paths import Paths
from finetune.tasks import Task

log = logging.getLogger(__name__)

MAX_CHECKED_BATCHES = 2000  # per split; beyond it a sample (batches_to_check)


def check_batch(batch: dict, tokenizer: PreTrainedTokenizerBase, where: str, task: Task, labeled: bool = True) -> None:
    """Check one collated batch against the rules: keys are the tokenizer's model inputs plus ``labels`` (none when not
    ``labeled``); every tensor is ``[batch, seq_len]`` (``labels``: ``[batch]``); ``seq_len`` is the longest real
    sequence; padding is the pad id with attention_mask 0, only at the end; no empty sequence; labels are int64 class
    ids in ``[0, num_labels)``, or finite float scores for regression.

    Raises:
        CollateError: at the first broken rule, naming ``where`` (e.g. ``split=train batch=3``) and the rule.
    """

    def fail(rule: str, detail: str) -> None:
        raise CollateError(f"{where} rule={rule}: {detail}")

    expected = set(tokenizer.model_input_names) | ({"labels"} if labeled else set())
    if set(batch) != expected:
        fail("keys", f"got {sorted(batch)}, expected {sorted(expected)}")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if ids.dim() != 2:
        fail("shape", f"input_ids has shape {list(ids.shape)}, expected [batch, seq_len]")
    for key in tokenizer.model_input_names:
        if batch[key].shape != ids.shape:
            fail("shape", f"{key} has shape {list(batch[key].shape)}, input_ids {list(ids.shape)}")
    if labeled and batch["labels"].shape != ids.shape[:1]:
        fail("shape", f"labels has shape {list(batch['labels'].shape)}, expected [{ids.shape[0]}]")
    lengths = mask.sum(dim=1)
    if int(lengths.min()) == 0:
        fail("no-empty-sequence", f"row {int(lengths.argmin())} has no real token")
    if ids.shape[1] != int(lengths.max()):
        fail("dynamic-padding", f"seq_len {ids.shape[1]} != longest real sequence {int(lengths.max())}")
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    real = positions < lengths[:, None]  # right padding: real tokens first, then padding
    if not torch.equal(mask.bool(), real):
        fail("padding-at-end", "attention_mask is not 1s followed by 0s in every row")
    if not bool((ids[~real] == tokenizer.pad_token_id).all()):
        fail("pad-id", f"a padded position holds an id other than pad id {tokenizer.pad_token_id}")
    if labeled:
        check_labels(batch["labels"], where, task)


def check_labels(labels: torch.Tensor, where: str, task: Task) -> None:
    """Check ``labels`` ``[rows]``: int64 class ids in ``[0, num_labels)``, or finite float scores for regression.

    Raises:
        CollateError: naming ``where`` and the rule ``labels``.
    """
    if task.is_regression:
        if not labels.is_floating_point() or not bool(torch.isfinite(labels).all()):
            raise CollateError(f"{where} rule=labels: regression labels must be finite floats, got {labels.dtype} "
                               f"{labels.tolist()[:8]}")
    elif labels.dtype != torch.int64 or not bool(((labels >= 0) & (labels < task.num_labels)).all()):
        raise CollateError(f"{where} rule=labels: labels {sorted(set(labels.tolist()))} ({labels.dtype}) not all "
                           f"class ids in [0, {task.num_labels}) of {list(task.label_names)}")


def check_split(dataloader, tokenizer: PreTrainedTokenizerBase, split: str, task: Task, labeled: bool,
                seed: int = 0) -> dict:
    """Check the batches of one split and describe all of them. The batches are the DataLoader's own (its batch
    sampler's row indices, collated by its ``collate_fn``), so a length-grouped train order is checked as training
    sees it, and a split ``scoring_batches`` sorts by length as evaluation scores it; ``labeled``: its batches carry
    labels (a scoring batch carries none). ``seed`` draws the sample of batches (``batches_to_check``).

    Returns:
        ``batches``, ``first_batch_shapes``, ``padding_fraction`` (padded share of all tokens), ``mean_length`` and
        ``max_length`` (tokens), ``checked_batches``.

    Raises:
        CollateError: at the first broken rule (``check_batch``).
    """
    dataset = dataloader.dataset
    # row indices per batch, drawn as the DataLoader draws them (its generator: the same order), nothing collated
    batches = list(DataLoader(range(len(dataset)), batch_sampler=dataloader.batch_sampler,
                              generator=dataloader.generator, collate_fn=list))
    checked = batches_to_check(len(batches), seed)
    first_shapes = None
    for i in checked:
        batch = dataloader.collate_fn(dataset.__getitems__(batches[i]))  # the batch's rows, as the DataLoader fetches
        batch = batch[0] if isinstance(batch, tuple) else batch  # a scoring batch: (batch, its real rows)
        check_batch(batch, tokenizer, f"split={split} batch={i}", task, labeled)
        if first_shapes is None:
            first_shapes = {k: list(v.shape) for k, v in batch.items()}
    if isinstance(dataset, Subset):  # scoring_batches': TokenRows in the order scored
        row_lengths = dataset.dataset.lengths()
        lengths = [row_lengths[i] for i in dataset.indices]
    else:
        lengths = token_lengths(dataset)
    real_tokens = sum(lengths)
    total_tokens = sum(len(b) * max(lengths[j] for j in b) for b in batches)
    return {"batches": len(batches), "first_batch_shapes": first_shapes,
            "padding_fraction": round(1 - real_tokens / total_tokens, 4),
            "mean_length": round(real_tokens / len(dataset), 2), "max_length": max(lengths),
            "checked_batches": len(checked)}


def batches_to_check(n: int, seed: int = 0) -> list[int]:
    """Which of ``n`` batches to check, in order: all up to ``MAX_CHECKED_BATCHES``; beyond, the first and
    the last quarter of that limit and a random half of it (``seed``) from between."""
    if n <= MAX_CHECKED_BATCHES:
        return list(range(n))
    edge = MAX_CHECKED_BATCHES // 4
    middle = random.Random(seed).sample(range(edge, n - edge), MAX_CHECKED_BATCHES - 2 * edge)
    return sorted([*range(edge), *middle, *range(n - edge, n)])


def check_forward(model, batch: dict, task: Task) -> dict:
    """One forward pass of ``model`` on ``batch``, without gradients: ``{"loss", "logits_shape"}``.

    Raises:
        CollateError: the logits are not ``[batch, num_labels]`` (``[batch, 1]`` for regression), or the loss is not
            finite.
    """
    with torch.no_grad():
        out = model(**batch)
    if tuple(out.logits.shape) != (batch["input_ids"].shape[0], task.num_labels):
        raise CollateError(f"split=train batch=0 rule=forward-logits: logits {list(out.logits.shape)}, expected "
                           f"[batch, {task.num_labels}]")
    if not torch.isfinite(out.loss):
        raise CollateError(f"split=train batch=0 rule=forward-loss: loss is {out.loss.item()}")
    return {"loss": round(out.loss.item(), 4), "logits_shape": list(out.logits.shape)}


def check_all(params: Params, paths: Paths) -> dict:
    """Check the batches of train and, as evaluation scores them (``scoring_batches`` in ``evaluate.batch_size``,
    sorted with ``evaluate.sort_by_length``), of ``evaluate.splits`` (``check_split``) and their labels
    (``check_labels``), then one forward pass (``check_forward``); returns split -> ``check_split``'s report, and
    ``forward`` -> ``check_forward``'s.

    Raises:
        CollateError: at the first broken rule, naming split, batch and rule.
    """
    tokenizer = AutoTokenizer.from_pretrained(paths.pretrained)
    collator = make_collator(tokenizer)
    tokenized, task = load_from_disk(str(paths.tokenized)), Task.load(paths.tokenized)
    loaders = {"train": train_dataloader(tokenized["train"], collator, params.train.batch_size, params.train.seed,
                                         params.train.group_by_length)}
    for split in present_splits(params.evaluate.splits, tokenized):
        loaders[split] = scoring_batches(TokenRows(tokenized[split]), tokenizer, params.evaluate.batch_size,
                                         sort_by_length=params.evaluate.sort_by_length)
        if is_labeled(tokenized[split]):  # evaluation reads them beside the batches
            check_labels(torch.tensor(tokenized[split]["labels"]), f"split={split}", task)
    report = {}
    for split, loader in loaders.items():
        report[split] = check_split(loader, tokenizer, split, task, split == "train", params.train.seed)
        r = report[split]
        log.info("%s: %s batches OK%s, padding %.1f%%", split, r["checked_batches"],
                 "" if r["checked_batches"] == r["batches"] else f" (a sample of {r['batches']})",
                 100 * r["padding_fraction"])
    torch.manual_seed(params.train.seed)
    model = load_classifier(paths.pretrained, task, params.model.pooling).eval()
    report["forward"] = check_forward(model, next(iter(loaders["train"])), task)
    log.info("Forward pass OK: loss %.4f, logits %s", report["forward"]["loss"], report["forward"]["logits_shape"])
    return report
