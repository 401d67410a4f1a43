"""How each served form compares with the PyTorch model it was made from: its metrics and logits on the labeled
splits, the verdict (an fp32 form must match within ``export.fp32_tolerance``; a lossy one is flagged past
``export.max_metric_drop``), and the section each form's model card gets.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from datasets import DatasetDict

from finetune.errors import ExportError
from finetune.evaluate.evaluation import evaluate_split, load_metric
from finetune.export.registry import FORMS
from finetune.inference.predictor import Predictor
from finetune.params import EvaluateParams, ExportParams
from finetune.tasks import predictions_of

log = logging.getLogger(__name__)


def score(predictor: Predictor, tokenized: DatasetDict, splits: list[str],
          p: EvaluateParams) -> tuple[dict, dict]:
    """``(metrics, logits)`` of ``predictor`` on each of ``splits`` (labeled), batched as evaluation batches: split
    -> ``{"loss", <the task's metrics>}`` rounded to 4 decimals, and split -> logits ``[examples, num_labels]``."""
    metrics, logits = {}, {}
    for split in splits:
        scores, logits[split] = evaluate_split(predictor, tokenized[split], load_metric(predictor.task), p, desc=split)
        metrics[split] = {k: round(v, 4) for k, v in scores.items()}
    return metrics, logits


def parity(logits: torch.Tensor, reference: torch.Tensor, predictor: Predictor) -> dict:
    """``max_abs_logit_diff`` and (classification) ``agreement`` of ``logits [examples, num_labels]`` with
    ``reference``, the PyTorch model's."""
    out = {"max_abs_logit_diff": float(f"{(logits - reference).abs().max().item():.3g}")}
    if not predictor.task.is_regression:
        same = predictions_of(logits, predictor.task) == predictions_of(reference, predictor.task)
        out["agreement"] = round(same.float().mean().item(), 4)
    return out


def check_parity(form: str, result: dict, splits: list[str], reference: dict, p: ExportParams, main_metric: str,
                 mode: str) -> None:
    """Fail on an fp32 form beyond the tolerance; add a ``warning`` to ``result`` for a lossy form whose main metric
    dropped more than ``export.max_metric_drop`` on a split.

    Raises:
        ExportError: ``form`` is fp32 and a split's ``max_abs_logit_diff`` exceeds ``export.fp32_tolerance``.
    """
    for split in splits:
        diff = result[split]["max_abs_logit_diff"]
        if not FORMS[form].lossy and not diff <= p.fp32_tolerance:  # NaN logits too
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
