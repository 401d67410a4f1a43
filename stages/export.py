"""Stage 8, export: the fine-tuned model (models/finetuned) in the forms that serve it, each checked against it.

Writes models/exported/<form>/ for each of ``export.forms`` (finetune/export/registry.py), each with the tokenizer,
config.json, task.json and the model card, and metrics/export.json:

    {"pytorch": {"validation": {<the task's metrics>}, ..., "size_mb", "speed": {"batch_1_p50_ms", ...}},
     "onnx-int8": {"validation": {<the task's metrics>, "agreement", "max_abs_logit_diff"}, ..., "size_mb",
                   "kept_fp32_matmuls", "warning": [...]}, "torch-bf16": {"skipped": "why"}, ...,
     "fastest_at_parity": {"machine": "cpu: AMD EPYC, 2 threads, avx512_bf16", "batch_1": form, "batch_32": form}}

``agreement``: the share of predictions equal to the PyTorch model's (classification); ``max_abs_logit_diff``: the
largest |logit - PyTorch's logit|. An fp32 form beyond ``export.fp32_tolerance`` fails the stage (nothing is
written); a lossy form whose main metric drops more than ``export.max_metric_drop`` on a split gets a ``warning``,
logged and repeated in its model card. The forms at parity and PyTorch are then timed (``time_forms``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.errors import ExportError
from finetune.export.registry import FORMS
from finetune.params import Params, load_params
from finetune.paths import Paths
from finetune.runtime import atomic_dir, run_stage, write_json

if TYPE_CHECKING:
    import torch
    from datasets import DatasetDict

    from finetune.tasks import Task

log = logging.getLogger(__name__)


def export_model(params: Params, paths: Paths) -> dict:
    """Make each form of ``export.forms`` into ``paths.exported`` (replaced only when all passed) and score each on
    the labeled splits of ``evaluate.splits`` against the PyTorch model; returns metrics/export.json's content.

    Raises:
        ExportError: a form can't be made, or an fp32 form's logits differ from PyTorch's beyond
            ``export.fp32_tolerance``.
    """
    from datasets import load_from_disk  # imported here, as in finetune/distill/teacher.py: no forms, no torch
    from transformers import AutoTokenizer

    from finetune.data.batches import evaluation_loader
    from finetune.data.prepare import is_labeled, present_splits
    from finetune.evaluate.evaluation import evaluate_split, load_metric
    from finetune.export.forms import PYTORCH, load_form
    from finetune.export.make import file_size_mb, make_forms
    from finetune.modeling import load_finetuned
    from finetune.runtime import make_accelerator, set_cpu_threads
    from finetune.tasks import Task

    p = params.export
    set_cpu_threads(None)
    accelerator = make_accelerator()  # not prepared: the forms run on the CPU
    task, tokenized = Task.load(paths.finetuned), load_from_disk(str(paths.tokenized))
    tokenizer = AutoTokenizer.from_pretrained(paths.finetuned)
    model = load_finetuned(paths.finetuned).eval()
    main_metric, mode = task.metric_for_best(None)
    splits = [s for s in present_splits(params.evaluate.splits, tokenized) if is_labeled(tokenized[s])]
    loaders = {s: evaluation_loader(tokenized[s], tokenizer, params.evaluate)[0] for s in splits}

    def score_form(classifier) -> tuple[dict, dict]:
        metrics, logits = {}, {}
        for split in splits:
            metrics[split], logits[split] = evaluate_split(classifier, loaders[split], accelerator, task,
                                                           load_metric(task), desc=split)
        return metrics, logits

    reference, reference_logits = score_form(model)
    results = {PYTORCH: {**{s: rounded(m) for s, m in reference.items()}, "size_mb": file_size_mb(paths.finetuned)}}
    classifiers = {PYTORCH: model}
    with atomic_dir(paths.exported) as tmp:
        made = make_forms(model, tokenizer, paths.finetuned, tmp, p, tokenized["train"])
        for form, extra in made.items():
            if "skipped" in extra:
                results[form] = extra
                continue
            classifiers[form] = load_form(form, paths.finetuned, tmp)
            metrics, logits = score_form(classifiers[form])
            results[form] = {**{s: {**rounded(metrics[s]), **parity(logits[s], reference_logits[s], task)}
                                for s in splits}, "size_mb": file_size_mb(tmp / form), **extra}
            check_parity(form, results[form], splits, reference, p, main_metric, mode)
            if "warning" in results[form] or (FORMS[form].lossy and not splits):  # not at parity, or not known to be
                del classifiers[form]
        results["fastest_at_parity"] = time_forms(results, classifiers, tokenized, tokenizer)
        for form in made:
            add_form_to_card(tmp / form / "README.md", form, results[form], results["fastest_at_parity"])
    return results


def time_forms(results: dict, classifiers: dict, tokenized: DatasetDict, tokenizer) -> dict:
    """Add each of ``classifiers``' ``form_speed`` on the validation split (else train) to ``results`` as ``speed``.

    Returns:
        ``fastest_at_parity``: this machine, and the fastest form at batch 1 and at batch 32.
    """
    from finetune.data.batches import make_collator
    from finetune.export.forms import SPEED_ROWS, fastest, form_speed
    from finetune.hardware import describe_device

    collator, rows = make_collator(tokenizer), tokenized["validation" if "validation" in tokenized else "train"]
    for form, classifier in classifiers.items():
        log.info("%s: timing at batch 1 and batch 32 on %d rows", form, min(len(rows), SPEED_ROWS))
        results[form]["speed"] = form_speed(classifier, rows, collator)
    return fastest({form: results[form]["speed"] for form in classifiers}, describe_device("cpu"))


def rounded(metrics: dict) -> dict:
    return {k: round(v, 4) for k, v in metrics.items()}


def parity(logits: torch.Tensor, reference: torch.Tensor, task: Task) -> dict:
    """``max_abs_logit_diff`` and (classification) ``agreement`` of ``logits [examples, num_labels]`` with
    ``reference``."""
    from finetune.evaluate.evaluation import predictions_of

    out = {"max_abs_logit_diff": float(f"{(logits - reference).abs().max().item():.3g}")}
    if not task.is_regression:
        same = predictions_of(logits, task) == predictions_of(reference, task)
        out["agreement"] = round(same.float().mean().item(), 4)
    return out


def check_parity(form: str, result: dict, splits: list[str], reference: dict, p, main_metric: str, mode: str):
    """Fail on an fp32 form beyond the tolerance; flag a lossy form whose main metric dropped too much.

    Raises:
        ExportError: ``form`` is fp32 and a split's ``max_abs_logit_diff`` exceeds ``export.fp32_tolerance``.
    """
    for split in splits:
        diff = result[split]["max_abs_logit_diff"]
        if not FORMS[form].lossy and diff > p.fp32_tolerance:
            raise ExportError(f"{form}: {split} logits differ from the PyTorch model's by up to {diff} (more than "
                              f"export.fp32_tolerance {p.fp32_tolerance}): the export is wrong; nothing was written")
        drop = reference[split][main_metric] - result[split][main_metric]
        drop = drop if mode == "max" else -drop
        if FORMS[form].lossy and drop > p.max_metric_drop:
            warning = (f"{form} loses {drop:.4f} {main_metric} on {split} against the PyTorch model (more than "
                       f"export.max_metric_drop {p.max_metric_drop})")
            log.warning(warning)
            result.setdefault("warning", []).append(warning)


def add_form_to_card(card: Path, form: str, result: dict, fastest: dict) -> None:
    """Append to the form's model card how to load it, its parity with PyTorch and whether it was fastest."""
    if not card.exists() or "skipped" in result:
        return
    lines = [f"\n## This form: {form}\n", f"Made by the export stage (docs/serving.md); load with "
             f"`{FORMS[form].loaded_with}` and the tokenizer of this folder. Against the PyTorch fp32 model, from "
             "metrics/export.json:\n",
             "```json", json.dumps(result, indent=2), "```"]
    lines += [f"\n**Warning:** {w}." for w in result.get("warning", [])]
    lines += [f"\n**The fastest form at parity at {n.replace('_', ' ')}** on the export stage's machine "
              f"({fastest['machine']}; metrics/export.json)." for n in ("batch_1", "batch_32") if fastest[n] == form]
    card.write_text(card.read_text() + "\n".join(lines) + "\n")


def main() -> None:
    params, paths = load_params(), Paths()
    if not params.export.forms:
        with atomic_dir(paths.exported):  # an empty folder: DVC's output, and no stale forms
            log.info("export.forms is empty: no served forms")
        write_json(paths.metrics / "export.json", {})
        return
    results = export_model(params, paths)
    write_json(paths.metrics / "export.json", results)
    for form, result in results.items():
        log.info("%s: %s", form, result)


if __name__ == "__main__":
    run_stage(main)
