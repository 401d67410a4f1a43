"""Stage 4, teacher: the logits of a fine-tuned teacher for every train row, for knowledge distillation.

With ``distill.teacher`` (a fine-tuned model folder under models/own, of any family and tokenizer), the teacher reads
the train split's texts of data/raw with its own tokenizer, in the row order of data/tokenized, and writes
data/teacher/: ``logits.npy`` (``[rows, num_labels]`` float32) and ``teacher.json`` (its identity: folder, model
type, weights' sha256, labels, rows, seconds); with ``distill.transfer`` also the transfer set (unlabelled pairs,
finetune/distill/transfer.py) and its logits: ``transfer.parquet`` and ``transfer_logits.npy``. With ``distill.teacher:
null`` it writes only ``teacher.json`` saying distillation is off, loading nothing. The folder is written atomically.
"""

from __future__ import annotations

import logging

from finetune.distill.teacher import save_teacher, teacher_logits, write_off
from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import run_stage

log = logging.getLogger(__name__)


def main() -> None:
    params, paths = load_params(), Paths()
    if params.distill.teacher is None:
        write_off(paths.teacher)
        log.info("distill.teacher is null: distillation is off; wrote %s only", paths.teacher / "teacher.json")
        return
    teacher = teacher_logits(params, paths)
    save_teacher(paths.teacher, teacher)
    log.info("Wrote the teacher's logits %s of %d train rows%s to %s (%.1f s)", list(teacher.logits.shape),
             teacher.identity["rows"], "" if teacher.transfer is None else f" and {len(teacher.transfer)} transfer "
             "pairs", paths.teacher, teacher.identity["seconds"])


if __name__ == "__main__":
    run_stage(main)
