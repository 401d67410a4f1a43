"""Served equals evaluated, row by row: ``tools.serve``'s answers to the validation split against the evaluate stage's
data/predictions/validation.csv, and how many rows may differ when the two ran in different precisions.

Evaluated and served in fp32 (the evaluate stage with ``train.mixed_precision: no``, an fp32 form served on the CPU),
every label must be the same. Otherwise the two are different computations (bf16 autocast in evaluation is not a
bf16 or int8 form's arithmetic either), and the rows that may differ are those metrics/export.json gives for the
served form (its labels against the PyTorch fp32 model's) plus those the evaluation's own precision moves from
fp32, measured in the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from finetune.export.registry import FORMS
from finetune.hardware import serving_dtype
from finetune.inference.predictor import PYTORCH

PRECISIONS = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}  # train.mixed_precision -> the evaluation's precision


@dataclass(frozen=True)
class Agreement:
    """``same`` of ``rows`` answers carry the evaluated label; ``differing``: the ``idx`` of the others (a row with
    no answer among them); ``max_probability_diff``: the largest difference of a class probability over the rows
    answered; ``allowed``: how many rows may differ (0: every label must be the same; None: no bound known)."""

    rows: int
    same: int
    differing: list = field(default_factory=list)
    max_probability_diff: float | None = None
    allowed: int | None = 0

    @property
    def met(self) -> bool | None:
        """Whether at most ``allowed`` rows differ; None when no bound is known."""
        return None if self.allowed is None else self.rows - self.same <= self.allowed

    def line(self) -> str:
        """The report's line."""
        return f"agreement with the evaluate stage's predictions: {self.same} / {self.rows} rows"


def agreement(answers: list[dict | None], evaluated: pd.DataFrame, allowed: int | None = 0) -> Agreement:
    """Compare ``answers`` (per row of ``evaluated``, in its order: a served answer ``{"label": name,
    "probabilities": {name: p}}``, or None where none came) with ``evaluated`` (the evaluate stage's predictions:
    ``idx``, ``prediction``, ``probability_<name>``).

    Raises:
        ValueError: the two hold different numbers of rows.
    """
    if len(answers) != len(evaluated):
        raise ValueError(f"{len(answers)} answers for {len(evaluated)} evaluated rows")
    idx = evaluated["idx"].tolist() if "idx" in evaluated.columns else list(range(len(evaluated)))
    same, differing, diffs = 0, [], []
    for i, (answer, row) in enumerate(zip(answers, evaluated.to_dict("records"))):
        if answer is not None and answer["label"] == row["prediction"]:
            same += 1
        else:
            differing.append(idx[i])
        if answer is not None:
            diffs += [abs(p - row[f"probability_{name}"]) for name, p in answer["probabilities"].items()]
    return Agreement(len(answers), same, differing, round(max(diffs), 6) if diffs else None, allowed)


def evaluation_precision(train_metrics: Path) -> str:
    """The precision the evaluate stage ran in: metrics/train.json's ``mixed_precision`` (evaluation runs in
    training's), as ``fp32``, ``bf16`` or ``fp16``.

    Raises:
        SystemExit: the file is missing or has no such key.
    """
    try:
        return PRECISIONS[json.loads(train_metrics.read_text())["mixed_precision"]]
    except (OSError, ValueError, KeyError) as err:
        raise SystemExit(f"ERROR: {train_metrics}: no mixed_precision ({type(err).__name__}: {err}); the precision "
                         "the evaluate stage ran in is read there: run dvc repro train") from None


def served_precision(form: str, device: str) -> str:
    """The precision ``tools.serve`` runs ``form`` in on ``device``: the PyTorch model in fp32 on the CPU and in bf16
    (or fp16) on a GPU; an fp32 form in fp32; a lossy one as its name ends (``onnx-int8``: int8)."""
    if form == PYTORCH:
        dtype = serving_dtype(device)
        return "fp32" if dtype is None else {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    return form.rsplit("-", 1)[-1] if FORMS[form].lossy else "fp32"


def allowed_differences(form: str, evaluated_in: str, served_in: str, export_metrics: dict, rows: int,
                        evaluation_off: int | None) -> tuple[int | None, str]:
    """How many of ``rows`` validation rows may differ between the evaluated and the served labels, and why, in one
    sentence: 0 where both are fp32; else the rows metrics/export.json (``export_metrics``) gives ``form`` off the
    PyTorch fp32 model (``1 - agreement`` of its validation rows; 0 for ``pytorch``) plus ``evaluation_off``, the
    rows the evaluation's labels differ from the PyTorch fp32 model's. None where either is unknown."""
    if evaluated_in == served_in == "fp32":
        return 0, "evaluated and served in fp32: every label must be the same"
    said = f"evaluated in {evaluated_in} (metrics/train.json), served in {served_in} ({form})"
    if form == PYTORCH and served_in == "fp32":
        form_off, source = 0, "0 for the pytorch form (the PyTorch fp32 model itself)"
    elif (share := export_metrics.get(form, {}).get("validation", {}).get("agreement")) is not None:
        form_off = round((1 - share) * rows)
        source = f"{form_off} rows where {form} differs from the PyTorch fp32 model (metrics/export.json: agreement " \
                 f"{share})"
    else:
        return None, f"{said}: no bound, as metrics/export.json gives no validation agreement for {form}"
    if evaluation_off is None:
        return None, f"{said}: no bound, as the evaluation's rows off fp32 were not measured"
    return (form_off + evaluation_off,
            f"{said}: at most {form_off + evaluation_off} rows may differ: {source}, and {evaluation_off} where the "
            f"{evaluated_in} evaluation differs from the PyTorch fp32 model (measured in this run)")
