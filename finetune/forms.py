"""Running a served form of the fine-tuned model (made by finetune/export.py into models/exported/<form>/) behind the
interface that evaluation and prediction already use: ``model(**batch).logits``, ``model.config``, ``model.eval()``.

Each form folder loads on its own, with the tokenizer beside it:

    tokenizer = AutoTokenizer.from_pretrained("models/exported/onnx-int8")
    session = onnxruntime.InferenceSession("models/exported/onnx-int8/model.onnx")
    logits = session.run(None, dict(tokenizer(["A pair"], ["of sentences"], return_tensors="np")))[0]

    model = AutoModelForSequenceClassification.from_pretrained("models/exported/torch-bf16")  # bf16 weights
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from finetune.errors import ExportError
from finetune.export import FORMS, ONNX_FILE
from finetune.modeling import load_finetuned

PYTORCH = "pytorch"  # the fine-tuned model as trained: models/finetuned, fp32


class OnnxClassifier(torch.nn.Module):
    """An ONNX Runtime session of ``model.onnx`` in ``folder`` as a classifier: ``forward(**batch)`` takes the
    tokenizer's tensors ``[batch, seq_len]`` and returns ``SequenceClassifierOutput(logits [batch, num_labels])``
    (float32 on the CPU); ``config`` is the folder's config.json (labels).

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


def load_form(form: str, model_dir: Path, exported_dir: Path) -> PreTrainedModel | OnnxClassifier:
    """The classifier of ``form``: ``pytorch`` (``model_dir``, fp32), or one of ``finetune.export.FORMS`` from
    ``exported_dir / form``.

    Raises:
        ExportError: an unknown form, or one whose folder is missing (the message says how to make it).
        CheckpointError: the PyTorch folder lacks config, weights or tokenizer.
    """
    if form == PYTORCH:
        return load_finetuned(model_dir)
    if form not in FORMS:
        raise ExportError(f"unknown form {form!r}: one of {[PYTORCH, *FORMS]}")
    folder = exported_dir / form
    if not folder.is_dir():
        raise ExportError(f"{folder}: not found; add {form} to export.forms in params.yaml and run dvc repro export "
                          "(torch-bf16 is skipped where the hardware has no bf16: metrics/export.json says why)")
    if form == "torch-bf16":
        return load_finetuned(folder).to(torch.bfloat16)
    return OnnxClassifier(folder)
