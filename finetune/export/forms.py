"""Loading a served form (models/exported/<form>/) behind the interface evaluation and prediction use:
``model(**batch).logits``, ``model.config``, ``model.eval()``. Each form folder also loads on its own:

    tokenizer = AutoTokenizer.from_pretrained("models/exported/onnx-int8")
    session = onnxruntime.InferenceSession("models/exported/onnx-int8/model.onnx")
    logits = session.run(None, dict(tokenizer(["A pair"], ["of sentences"], return_tensors="np")))[0]

    model = AutoModelForSequenceClassification.from_pretrained("models/exported/torch-bf16")  # bf16 weights

    compiled = openvino.compile_model("models/exported/openvino-int8/openvino_model.xml", "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32"})  # the hint in the folder's openvino.json
    logits = compiled(dict(tokenizer(["A pair"], ["of sentences"], return_tensors="np")))[0]
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import AutoConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from finetune.errors import ExportError
from finetune.export.make import ONNX_FILE
from finetune.export.openvino import OV_CONFIG, OV_FILE, SERVE_EXTRA
from finetune.export.registry import FORMS, PYTORCH, resolve
from finetune.modeling import load_finetuned

if TYPE_CHECKING:
    from datasets import Dataset

    from finetune.data.batches import PairCollator

SPEED_ROWS, LATENCY_ROWS = 512, 64  # form_speed: rows timed at batch 32, and of those, one by one at batch 1


class OnnxClassifier(torch.nn.Module):
    """``folder``'s ``model.onnx`` in ONNX Runtime on the CPU: ``forward(**batch)`` takes the tokenizer's tensors
    ``[batch, seq_len]`` and returns ``SequenceClassifierOutput(logits [batch, num_labels])`` (float32).

    Raises:
        ExportError: ONNX Runtime is not installed, or the folder has no model.onnx.
    """

    def __init__(self, folder: Path, num_threads: int | None = None):
        super().__init__()
        try:
            import onnxruntime as ort
        except ImportError:
            raise ExportError("ONNX Runtime is not installed: bash .ci/setup (the lock has it), or "
                              "pip install onnxruntime") from None
        if not (folder / ONNX_FILE).is_file():
            raise ExportError(f"{folder / ONNX_FILE}: not found; run the export stage (dvc repro export) with this "
                              "form in export.forms")
        options = ort.SessionOptions()
        options.intra_op_num_threads = num_threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(folder / ONNX_FILE), options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.config = AutoConfig.from_pretrained(folder)

    def forward(self, **batch: torch.Tensor) -> SequenceClassifierOutput:
        feed = {name: np.asarray(batch[name], dtype=np.int64) for name in self.input_names}
        return SequenceClassifierOutput(logits=torch.from_numpy(self.session.run(["logits"], feed)[0]))


class OpenVinoClassifier(torch.nn.Module):
    """``folder``'s OpenVINO IR compiled for the CPU with its ``openvino.json`` hint; ``forward`` as
    ``OnnxClassifier``'s.

    Raises:
        ExportError: OpenVINO is not installed, or the folder has no openvino_model.xml.
    """

    def __init__(self, folder: Path, num_threads: int | None = None):
        super().__init__()
        try:
            import openvino as ov
        except ImportError:
            raise ExportError(f"OpenVINO is not installed: {SERVE_EXTRA}") from None
        if not (folder / OV_FILE).is_file():
            raise ExportError(f"{folder / OV_FILE}: not found; run the export stage (dvc repro export) with this "
                              "form in export.forms")
        hint = json.loads((folder / OV_CONFIG).read_text())["inference_precision"]
        self.compiled = ov.Core().compile_model(str(folder / OV_FILE), "CPU", {
            "INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": num_threads or torch.get_num_threads()})
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        self.config = AutoConfig.from_pretrained(folder)

    def forward(self, **batch: torch.Tensor) -> SequenceClassifierOutput:
        feed = {name: np.asarray(batch[name], dtype=np.int64) for name in self.input_names}
        return SequenceClassifierOutput(logits=torch.from_numpy(np.array(self.compiled(feed)[0], dtype=np.float32)))


def load_bf16(folder: Path) -> PreTrainedModel:
    """The ``torch-bf16`` form in ``folder``.

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer.
    """
    return load_finetuned(folder).to(torch.bfloat16)


def form_folder(form: str, model_dir: Path, exported_dir: Path) -> Path:
    """``model_dir`` for ``pytorch``, else ``exported_dir / form``, checked to exist without loading it.

    Raises:
        ExportError: a form the registry lacks, or a missing folder (the message says how to make it).
    """
    if form == PYTORCH:
        return model_dir
    if form not in FORMS:
        raise ExportError(f"unknown form {form!r}: one of {[PYTORCH, *FORMS]}")
    folder = exported_dir / form
    if not folder.is_dir():
        raise ExportError(f"{folder}: not found; add {form} to export.forms in params.yaml and run dvc repro export "
                          "(torch-bf16 is skipped where the hardware has no bf16: metrics/export.json says why)")
    return folder


def load_form(form: str, model_dir: Path, exported_dir: Path) -> torch.nn.Module:
    """The classifier of ``form`` (``pytorch``: ``model_dir``, fp32), by its registry entry's loader.

    Raises:
        ExportError: an unknown form, one whose folder is missing (the message says how to make it), or one whose
            runtime is not installed.
        CheckpointError: a PyTorch folder lacks config, weights or tokenizer.
    """
    if form == PYTORCH:
        return load_finetuned(model_dir)
    folder = form_folder(form, model_dir, exported_dir)  # checks the name before the registry is read
    return resolve(FORMS[form].load)(folder)


def form_speed(classifier, rows: Dataset, collator: PairCollator) -> dict:
    """How fast ``classifier`` runs on torch's CPU threads over a tokenized split's first ``SPEED_ROWS`` rows,
    tokenizing excluded (``benchmarks/serve.py`` times from text), after one untimed pass.

    Returns:
        ``batch_1_p50_ms``: median ms per row over ``LATENCY_ROWS`` rows one at a time; ``batch_32_rows_per_s``:
        rows per second in batches of 32, sorted by length as ``tools.predict`` batches them.
    """
    from finetune.data.batches import eval_dataloader, length_order

    rows = rows.select(range(min(len(rows), SPEED_ROWS)))
    rows = rows.remove_columns([c for c in rows.column_names if c not in ("input_ids", "attention_mask",
                                                                          "token_type_ids")])
    by_length = rows.select(length_order(rows))
    singles = eval_dataloader(rows.select(range(min(len(rows), LATENCY_ROWS))), collator, 1)
    batches = eval_dataloader(by_length, collator, 32)

    def seconds(batch) -> float:
        begin = time.perf_counter()
        classifier(**batch)
        return time.perf_counter() - begin

    with torch.inference_mode():
        for batch in [*singles, *batches]:  # warm-up: OpenVINO compiles for each new shape on its first call
            classifier(**batch)
        one = [seconds(batch) for batch in singles]
        total = sum(seconds(batch) for batch in batches)
    return {"batch_1_p50_ms": round(float(np.median(one)) * 1e3, 2), "batch_32_rows_per_s": round(len(rows) / total, 1)}


def fastest(speeds: dict[str, dict], where: str) -> dict:
    """``{"machine": where, "batch_1": form, "batch_32": form}``: the fastest of ``speeds`` (form ->
    ``form_speed``) at each."""
    return {"machine": where, "batch_1": min(speeds, key=lambda f: speeds[f]["batch_1_p50_ms"]),
            "batch_32": max(speeds, key=lambda f: speeds[f]["batch_32_rows_per_s"])}
