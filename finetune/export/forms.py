"""The export stage's work: each form of ``export.forms`` made from the fine-tuned model by its registry entry
(``make_forms``), scored against it on the labeled splits (``parity``), the forms at parity timed (``speed``), and
each form's model card told how it compares.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from datasets import Dataset, load_from_disk
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from finetune.data.prepare import is_labeled, present_splits
from finetune.export.make import MakeJob, copy_side_files, file_size_mb
from finetune.export.parity import add_form_to_card, check_parity, parity, score
from finetune.export.registry import FORMS, check_forms, open_form, unmet
from finetune.export.speed import SPEED_ROWS, fastest, form_speed
from finetune.hardware import describe_device
from finetune.inference.predictor import PYTORCH
from finetune.params import ExportParams, Params
from finetune.paths import Paths
from finetune.runtime import atomic_dir

log = logging.getLogger(__name__)


def export_forms(params: Params, paths: Paths) -> dict:
    """Make each form of ``export.forms`` into ``paths.exported`` (replaced only when all passed), score each on the
    labeled splits of ``evaluate.splits`` (validation where none is labeled) against the PyTorch model, and time
    PyTorch and the forms at parity on the validation split (else train).

    Returns:
        metrics/export.json's content: per form its metrics per split with ``agreement`` and
        ``max_abs_logit_diff``, ``size_mb``, what its maker records, ``speed`` (at parity) and any ``warning``, or
        ``{"skipped": why}``; ``fastest_at_parity``: this machine, and the fastest form at batch 1 and at batch 32.

    Raises:
        ParamsError: ``export.forms`` names a form the registry lacks.
        ExportError: a form can't be made, or an fp32 form's logits differ from PyTorch's beyond
            ``export.fp32_tolerance``.
    """
    p = params.export
    check_forms(p.forms)
    reference = open_form(paths.finetuned)  # fp32 on the CPU, as every form runs
    task, tokenized = reference.task, load_from_disk(str(paths.tokenized))
    main_metric, mode = task.metric_for_best(None)
    # parity on the evaluated splits that have labels; on validation (labeled throughout) when none has
    labeled = [s for s in present_splits(params.evaluate.splits, tokenized) if is_labeled(tokenized[s])]
    splits = labeled or ["validation"]
    reference_metrics, reference_logits = score(reference, tokenized, splits, params.evaluate)
    results = {PYTORCH: {**reference_metrics, "size_mb": file_size_mb(paths.finetuned)}}
    timed = {PYTORCH: reference}
    with atomic_dir(paths.exported) as tmp:
        made = make_forms(reference.model, reference.tokenizer, paths.finetuned, tmp, p, tokenized["train"])
        for form, extra in made.items():
            if "skipped" in extra:
                results[form] = extra
                continue
            predictor = open_form(tmp / form, form)
            metrics, logits = score(predictor, tokenized, splits, params.evaluate)
            results[form] = {**{s: {**metrics[s], **parity(logits[s], reference_logits[s], predictor)}
                                for s in splits}, "size_mb": file_size_mb(tmp / form), **extra}
            check_parity(form, results[form], splits, reference_metrics, p, main_metric, mode)
            if "warning" not in results[form]:  # at parity
                timed[form] = predictor
        rows = tokenized["validation" if "validation" in tokenized else "train"]
        for form, predictor in timed.items():
            log.info("%s: timing at batch 1 and batch 32 on %d rows", form, min(len(rows), SPEED_ROWS))
            results[form]["speed"] = form_speed(predictor, rows)
        results["fastest_at_parity"] = fastest({form: results[form]["speed"] for form in timed},
                                               describe_device("cpu"))
        for form in made:
            add_form_to_card(tmp / form / "README.md", form, results[form], results["fastest_at_parity"])
    return results


def make_forms(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, model_dir: Path, out_dir: Path,
               p: ExportParams, train: Dataset | None = None) -> dict[str, dict]:
    """Make each form of ``p.forms`` of ``model`` (saved in ``model_dir``) in ``out_dir / <form>`` by its registry
    entry's maker. A form whose needs this machine does not meet is skipped (INFO for hardware, WARNING for a
    package). Base forms are made first and kept only when ``p.forms`` lists them; ``train`` calibrates OpenVINO int8.

    Returns:
        Per form of ``p.forms``, in its order: ``{"skipped": why}``, or what its maker returned.

    Raises:
        ExportError: the exporter or the quantizer can't handle the model (``export_onnx``, ``quantize_openvino``).
    """
    made, asked = {}, []
    for name in p.forms:
        if problem := unmet(name):
            need, why = problem
            (log.warning if need.kind == "package" else log.info)("%s: skipped: %s", name, why)
            made[name] = {"skipped": why}
        else:
            asked.append(name)
    bases = []
    for name in asked:
        chain, base = [], FORMS[name].base
        while base is not None:
            chain.insert(0, base)
            base = FORMS[base].base
        bases += chain
    for name in dict.fromkeys([*bases, *asked]):  # each base before the forms made from it
        form = FORMS[name]
        copy_side_files(model_dir, out_dir / name)
        job = MakeJob(name, model, tokenizer, out_dir / name, None if form.base is None else out_dir / form.base, p,
                      train)
        made[name] = form.make(job)
    for name in set(bases) - set(p.forms):
        shutil.rmtree(out_dir / name, ignore_errors=True)
    return {name: made[name] for name in p.forms}
