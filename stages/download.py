"""Stage 1, download: the raw MRPC splits and the pretrained checkpoint, with their provenance.

Writes data/raw/ (DatasetDict.save_to_disk), models/pretrained/ (tokenizer + model, save_pretrained) and
metrics/provenance.json (source used, revision, sha256 of the source files, rows and label balance per split).
"""

from __future__ import annotations

import logging
from pathlib import Path

from datasets import DatasetDict
from transformers import AutoModel, AutoTokenizer

from finetune.data import SPLITS, check_raw, label_balance, load_raw
from finetune.params import DataParams, Paths, load_params
from finetune.runtime import atomic_dir, run_stage, write_json
from finetune.sources import check_checkpoint, resolve_checkpoint, resolve_dataset

log = logging.getLogger(__name__)


def download_dataset(p: DataParams, out_dir: Path) -> dict:
    """Load ``p.dataset``/``p.config`` (or its local copy), check it, save it to ``out_dir``; return provenance.

    Every check runs before ``out_dir`` is touched: on an error, nothing is written.

    Raises:
        SourceError: neither the dataset nor its local copy can be found (``resolve_dataset``).
        DataError: the files can't be loaded (``load_raw``) or the data breaks a rule (``check_raw``).
    """
    source = resolve_dataset(p.dataset, p.config, p.local_copy)
    raw = load_raw(source.path, p.config)
    raw = DatasetDict({split: raw[split] for split in SPLITS if split in raw})
    check_raw(raw, source.path)
    if p.max_samples:
        log.warning("Keeping only the first %d rows of each split (params.yaml data.max_samples)", p.max_samples)
        raw = DatasetDict({s: ds.select(range(min(p.max_samples, len(ds)))) for s, ds in raw.items()})
    with atomic_dir(out_dir) as tmp:
        raw.save_to_disk(str(tmp))
    splits = {split: label_balance(ds) for split, ds in raw.items()}
    log.info("Saved %s to %s: %s", p.dataset, out_dir, {s: v["rows"] for s, v in splits.items()})
    return {**source.provenance(), "config": p.config, "splits": splits}


def download_checkpoint(checkpoint: str, out_dir: Path) -> dict:
    """Copy tokenizer and model of ``checkpoint`` (Hub id or folder) to ``out_dir`` via save_pretrained.

    Raises:
        SourceError: no source has the checkpoint (``resolve_checkpoint``).
        CheckpointError: its folder lacks config, weights or tokenizer (``check_checkpoint``); nothing is written.
    """
    source = resolve_checkpoint(checkpoint)
    check_checkpoint(source.path)
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    model = AutoModel.from_pretrained(source.path)
    with atomic_dir(out_dir) as tmp:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
    parameters = sum(p.numel() for p in model.parameters())
    log.info("Saved %s (%s, %.1f M parameters) to %s", checkpoint, model.config.model_type, parameters / 1e6, out_dir)
    return {**source.provenance(), "model_type": model.config.model_type, "parameters": parameters}


def main() -> None:
    params, paths = load_params(), Paths()
    provenance = {
        "dataset": download_dataset(params.data, paths.raw),
        "checkpoint": download_checkpoint(params.model.checkpoint, paths.pretrained),
    }
    write_json(paths.metrics / "provenance.json", provenance)


if __name__ == "__main__":
    run_stage(main)
