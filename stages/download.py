"""Stage 1, download: the raw MRPC splits and the pretrained checkpoint, with their provenance.

Writes data/raw/ (DatasetDict.save_to_disk), models/pretrained/ (tokenizer + model, save_pretrained) and
metrics/provenance.json (source used, revision, sha256 of the source files, rows and label balance per split).
"""

from __future__ import annotations

from pathlib import Path

from datasets import DatasetDict, load_dataset
from transformers import AutoModel, AutoTokenizer

from stages.common import METRICS_DIR, PRETRAINED_DIR, RAW_DIR, DataParams, atomic_dir, load_params, setup_logging, write_json
from stages.data import SPLITS, check_raw, label_balance
from stages.sources import resolve_checkpoint, resolve_dataset

log = setup_logging()


def download_dataset(p: DataParams, out_dir: Path) -> dict:
    """Load ``p.dataset``/``p.config`` (or its local copy), check it, save it to ``out_dir``; return provenance."""
    source = resolve_dataset(p.dataset, p.config, p.local_copy)
    raw = load_dataset(source.path, p.config)
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
    """Copy tokenizer and model of ``checkpoint`` (Hub id or folder) to ``out_dir`` via save_pretrained."""
    source = resolve_checkpoint(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    model = AutoModel.from_pretrained(source.path)
    with atomic_dir(out_dir) as tmp:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
    parameters = sum(p.numel() for p in model.parameters())
    log.info("Saved %s (%s, %.1f M parameters) to %s", checkpoint, model.config.model_type, parameters / 1e6, out_dir)
    return {**source.provenance(), "model_type": model.config.model_type, "parameters": parameters}


def main() -> None:
    params = load_params()
    provenance = {
        "dataset": download_dataset(params.data, RAW_DIR),
        "checkpoint": download_checkpoint(params.model.checkpoint, PRETRAINED_DIR),
    }
    write_json(METRICS_DIR / "provenance.json", provenance)


if __name__ == "__main__":
    main()
