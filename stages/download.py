"""Stage download: the raw splits of a GLUE task (Hub or local copy) or of the user's own files with their task, and
the pretrained checkpoint (``finetune.data.download``). Writes data/raw/ (``DatasetDict.save_to_disk`` plus task.json),
models/pretrained/ (tokenizer and encoder, ``save_pretrained``) and metrics/provenance.json (per source: what was used,
its revision and sha256s; the task, rows and labels per split, and how a validation split was carved when the data had
none)."""

from __future__ import annotations

from finetune.data.download import download_checkpoint, download_dataset
from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import run_stage, write_json


def main() -> None:
    params, paths = load_params(), Paths()
    provenance = {
        "dataset": download_dataset(params.data, paths.raw),
        "checkpoint": download_checkpoint(params.model.checkpoint, paths.pretrained),
    }
    write_json(paths.metrics / "provenance.json", provenance)


if __name__ == "__main__":
    run_stage(main)
