"""How fast each form at parity runs on this machine, through the same ``Predictor.logits`` as evaluation,
``tools.predict`` and ``tools.serve``, and which is fastest (metrics/export.json's ``fastest_at_parity``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from datasets import Dataset

from finetune.data.batches import MODEL_INPUTS
from finetune.errors import ExportError, first_line
from finetune.export.registry import FORMS
from finetune.inference.predictor import PYTORCH, Predictor

EXPORT_METRICS = Path("metrics/export.json")  # the export stage's, with fastest_at_parity

SPEED_ROWS, LATENCY_ROWS = 512, 64  # rows timed at batch 32, and of those, one by one at batch 1


def form_speed(predictor: Predictor, rows: Dataset) -> dict:
    """How fast ``predictor`` scores a tokenized split's first ``SPEED_ROWS`` rows, tokenizing excluded
    (``benchmarks/serve.py`` times from text), after one untimed pass over the same batches.

    Returns:
        ``batch_1_p50_ms``: median ms per row over ``LATENCY_ROWS`` rows one at a time; ``batch_32_rows_per_s``:
        rows per second in batches of 32, sorted by length.
    """
    rows = rows.select(range(min(len(rows), SPEED_ROWS)))
    columns = {name: rows[name] for name in MODEL_INPUTS if name in rows.column_names}
    singles = [{name: values[i:i + 1] for name, values in columns.items()}
               for i in range(min(len(rows), LATENCY_ROWS))]

    def seconds(batch: dict, batch_size: int) -> float:
        begin = time.perf_counter()
        predictor.logits(batch, batch_size=batch_size)
        return time.perf_counter() - begin

    for one in singles:  # warm-up: OpenVINO compiles for each new shape on its first call
        seconds(one, 1)
    seconds(columns, 32)
    latencies = [seconds(one, 1) for one in singles]
    total = seconds(columns, 32)
    return {"batch_1_p50_ms": round(float(np.median(latencies)) * 1e3, 2),
            "batch_32_rows_per_s": round(len(rows) / total, 1)}


def fastest(speeds: dict[str, dict], where: str) -> dict:
    """``{"machine": where, "batch_1": form, "batch_32": form}``: the fastest of ``speeds`` (form ->
    ``form_speed``) at each."""
    return {"machine": where, "batch_1": min(speeds, key=lambda f: speeds[f]["batch_1_p50_ms"]),
            "batch_32": max(speeds, key=lambda f: speeds[f]["batch_32_rows_per_s"])}


def served_form(metrics: Path = EXPORT_METRICS) -> str:
    """The form to serve: ``fastest_at_parity.batch_32`` of the export stage's metrics (a server batches concurrent
    requests).

    Raises:
        ExportError: the file is missing, not JSON, or names no form of this code; the message says how to make
            it or choose one.
    """
    if not metrics.is_file():
        raise ExportError(f"{metrics}: not found, so no fastest form to serve; run dvc repro export, or choose one "
                          f"with --form ({', '.join([PYTORCH, *FORMS])})")
    try:
        record = json.loads(metrics.read_text())
    except ValueError as err:  # a merge conflict's markers, an empty file
        raise ExportError(f"{metrics}: not JSON ({first_line(err, 200)}); run dvc repro export (or git checkout "
                          "it), or choose --form") from None
    chosen = record.get("fastest_at_parity", {}).get("batch_32") if isinstance(record, dict) else None
    if chosen is None:
        raise ExportError(f"{metrics}: no fastest_at_parity.batch_32; run dvc repro export, or choose --form")
    if chosen not in (PYTORCH, *FORMS):
        raise ExportError(f"{metrics}: fastest_at_parity.batch_32 names {chosen!r}, not a form of this code "
                          f"({', '.join([PYTORCH, *FORMS])}); run dvc repro export, or choose --form")
    return chosen
