"""Stage export: the fine-tuned model (models/finetuned) in the forms that serve it, each checked against it
(``finetune.export.forms.export_forms``). Writes models/exported/<form>/ for each of ``export.forms``
(finetune/export/registry.py), each with the tokenizer, config.json, task.json and its model card, and
metrics/export.json:

    {"pytorch": {"validation": {<the task's metrics>}, ..., "size_mb", "speed": {"batch_1_p50_ms", ...}},
     "onnx-int8": {"validation": {<the task's metrics>, "agreement", "max_abs_logit_diff"}, ..., "size_mb",
                   "kept_fp32_matmuls", "warning": [...]}, "torch-bf16": {"skipped": "why"}, ...,
     "fastest_at_parity": {"machine": "cpu: AMD EPYC, 2 threads, avx512_bf16", "batch_1": form, "batch_32": form}}

``agreement``: the share of predictions equal to the PyTorch model's (classification); ``max_abs_logit_diff``: the
largest |logit - PyTorch's logit|. An fp32 form beyond ``export.fp32_tolerance`` fails the stage (nothing is
written); a lossy form whose main metric drops more than ``export.max_metric_drop`` on a split gets a ``warning``,
logged and repeated in its model card.
"""

from __future__ import annotations

import logging

from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import atomic_dir, run_stage, write_json

log = logging.getLogger(__name__)


def main() -> None:
    params, paths = load_params(), Paths()
    if not params.export.forms:
        with atomic_dir(paths.exported):  # an empty folder: DVC's output, and no stale forms
            log.info("export.forms is empty: no served forms")
        write_json(paths.metrics / "export.json", {})
        return
    from finetune.export.forms import export_forms  # torch, ONNX and the runtimes: only when there are forms

    results = export_forms(params, paths)
    write_json(paths.metrics / "export.json", results)
    for form, result in results.items():
        log.info("%s: %s", form, result)


if __name__ == "__main__":
    run_stage(main)
