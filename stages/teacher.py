"""Stage teacher: a fine-tuned teacher's logits of every train row (and transfer pair) in data/teacher
(``teacher.json``, ``logits.npy`` ``[rows, num_labels]`` float32; ``transfer.parquet``, ``transfer_logits.npy``);
with ``distill.teacher`` null only ``teacher.json`` saying distillation is off, loading nothing.
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
