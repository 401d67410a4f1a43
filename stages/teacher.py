"""Stage 4, teacher: the logits of a fine-tuned teacher for every train row, for knowledge distillation.

With ``distill.teacher`` (a fine-tuned model folder under models/own, of any family and tokenizer), the teacher reads
the train split's texts of data/raw with its own tokenizer, in the row order of data/tokenized, and writes
data/teacher/: ``logits.npy`` (``[rows, num_labels]`` float32), ``logits_swapped.npy`` where data/tokenized holds
each pair in both orders (``train.swap_pairs``), and ``teacher.json`` (its identity: folder, model type, weights'
sha256, labels, rows, seconds). With ``distill.transfer`` it makes the transfer set (unlabelled pairs,
finetune/transfer.py) and scores it too: ``transfer.parquet`` and ``transfer_logits.npy``. With
``distill.logits`` (a folder under data/teachers: a teacher stage's output made elsewhere, carried in git) it checks
those logits against this data and params and writes them, loading no model. With both null it writes only
``teacher.json`` saying distillation is off, loading nothing. The folder is written atomically (finetune/teacher.py).
"""

from __future__ import annotations

import logging

from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import run_stage
from finetune.teacher import carried_teacher, save_teacher, teacher_logits, write_off

log = logging.getLogger(__name__)


def main() -> None:
    params, paths = load_params(), Paths()
    if params.distill.teacher is None and params.distill.logits is None:
        write_off(paths.teacher)
        log.info("distill.teacher is null: distillation is off; wrote %s only", paths.teacher / "teacher.json")
        return
    if params.distill.logits is not None:
        log.info("Taking the teacher's logits carried in %s (no model is loaded)", params.distill.logits)
    teacher = teacher_logits(params, paths) if params.distill.logits is None else carried_teacher(params, paths)
    save_teacher(paths.teacher, teacher)
    transfer = teacher.transfer
    log.info("Wrote the teacher's logits %s%s of %d train rows%s to %s (%.1f s)", list(teacher.logits.shape),
             " in both orders" if teacher.logits_swapped is not None else "", teacher.identity["rows"],
             f" and {len(transfer.pairs)} transfer pairs" if transfer is not None else "", paths.teacher,
             teacher.identity["seconds"])


if __name__ == "__main__":
    run_stage(main)
