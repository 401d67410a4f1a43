"""The download stage's work: the dataset resolved (``finetune.data.sources``), loaded (``finetune.data.loading``),
checked and prepared (``finetune.data.prepare``) and saved with its task; the pretrained checkpoint's tokenizer and
encoder saved. Each returns its provenance record for metrics/provenance.json."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np
from datasets import DatasetDict
from transformers import AutoTokenizer

from finetune.data.labels import check_train_classes
from finetune.data.loading import load_files, load_raw
from finetune.data.prepare import carve_validation, check_scores_vary, data_columns, prepare_raw, split_summary
from finetune.data.sources import resolve_checkpoint, resolve_dataset, resolve_files
from finetune.modeling import load_encoder
from finetune.params import DataParams
from finetune.paths import project_path
from finetune.runtime import atomic_dir

log = logging.getLogger(__name__)


def download_dataset(p: DataParams, out_dir: Path) -> dict:
    """Load, check and prepare the dataset (``p.dataset`` / ``p.config``, or ``p.local_copy``, or ``p.files``), carve a
    validation split when it has none, keep the first ``p.max_samples`` rows of each split when set, and save it with
    its task to ``out_dir``; nothing is written when a check fails. Returns the dataset's provenance: the ``Source``
    record, ``config``, ``task``, ``validation_carved`` (None, or its fraction, seed, stratification and rows) and
    ``splits`` (``split_summary`` per split).

    Raises:
        SourceError: neither the dataset nor its local copy can be found (``resolve_dataset``).
        ParamsError: the own-data keys name a column twice or set class names for a regression (``prepare_raw``).
        DataError: the files can't be loaded (``load_raw``, ``load_files``) or the data breaks a rule (``prepare_raw``,
            ``carve_validation``, ``check_scores_vary``; train's first ``p.max_samples`` rows of one class).
    """
    if p.files is not None:
        source = resolve_files(p.files)
        raw = load_files({split: project_path(file) for split, file in p.files.items()})
        where = dict(p.files)
    else:
        source = resolve_dataset(p.dataset, p.config, p.local_copy)
        raw = load_raw(source.path, p.config, *data_columns(p))
        where = {split: source.path for split in raw}
    raw, task = prepare_raw(raw, p, where)
    carved = None
    if "validation" not in raw:
        train, validation = carve_validation(raw["train"], p.validation_fraction, p.split_seed,
                                             stratify=not task.is_regression, where=where["train"])
        raw = DatasetDict({"train": train, "validation": validation, **{s: d for s, d in raw.items() if s != "train"}})
        carved = {"from": "train", "fraction": p.validation_fraction, "seed": p.split_seed,
                  "stratified": not task.is_regression, "rows": len(validation)}
        log.warning("No validation split: carved %d rows (%.0f%%) from train, seed %d%s", len(validation),
                    100 * p.validation_fraction, p.split_seed, ", stratified by label" if carved["stratified"] else "")
    if p.max_samples:
        log.warning("Keeping only the first %d rows of each split (params.yaml data.max_samples)", p.max_samples)
        raw = DatasetDict({s: ds.select(range(min(p.max_samples, len(ds)))) for s, ds in raw.items()})
        if not task.is_regression:
            check_train_classes(np.asarray(raw["train"]["label"]), task.label_names,
                                f"{where['train']} (its first {p.max_samples} rows: data.max_samples)")
    check_scores_vary(raw, task, where)
    with atomic_dir(out_dir) as tmp:
        raw.save_to_disk(str(tmp))
        task.save(tmp)
    splits = {split: split_summary(ds, task) for split, ds in raw.items()}
    log.info("Saved task %r (%s) to %s: %s", task.name, "regression" if task.is_regression else
             f"{task.num_labels} classes {list(task.label_names)}", out_dir, {s: v["rows"] for s, v in splits.items()})
    return {**source.provenance(), "config": p.config, "task": asdict(task), "validation_carved": carved,
            "splits": splits}


def download_checkpoint(checkpoint: str, out_dir: Path) -> dict:
    """Save the tokenizer and encoder of ``checkpoint`` (``model.checkpoint``) to ``out_dir`` (``save_pretrained``); a
    fine-tuned checkpoint's head is not carried over (the train stage adds the task's). Returns the checkpoint's
    provenance: the ``Source`` record, ``model_type`` and ``parameters``.

    Raises:
        SourceError: no source has the checkpoint (``resolve_checkpoint``).
        CheckpointError: its folder lacks config, weights or tokenizer (``load_encoder``); nothing is written.
    """
    source = resolve_checkpoint(checkpoint)
    model = load_encoder(source.path)  # checks the folder first
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    with atomic_dir(out_dir) as tmp:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
    parameters = sum(p.numel() for p in model.parameters())
    log.info("Saved %s (%s, %.1f M parameters) to %s", checkpoint, model.config.model_type, parameters / 1e6, out_dir)
    return {**source.provenance(), "model_type": model.config.model_type, "parameters": parameters}
