"""The runtime of each served form (models/exported/<form>/) behind one interface: ``model(**batch).logits``
``[batch, num_labels]``, ``model.config``, ``model.eval()``. The registry (finetune/export/registry.py) names each
form's loader here, ``(folder, config) -> model``, and ``finetune.inference.predictor.Predictor.open`` opens a
folder with it, handing it the config it read. Each form folder also loads on its own:

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
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from finetune.errors import ExportError
from finetune.modeling import load_finetuned

ONNX_FILE = "model.onnx"  # the ONNX forms' graph
OV_FILE = "openvino_model.xml"  # the OpenVINO forms' IR, with openvino_model.bin beside it
OV_CONFIG = "openvino.json"  # {"inference_precision": "f32" | "bf16", ...}
SERVE_EXTRA = "pip install -e '.[serve]' (or bash .ci/setup: the lock has it)"


class OnnxClassifier(torch.nn.Module):
    """``folder``'s ``model.onnx`` in ONNX Runtime on the CPU: ``forward(**batch)`` takes the tokenizer's tensors
    ``[batch, seq_len]`` and returns ``SequenceClassifierOutput(logits [batch, num_labels])`` (float32). ``config``:
    the folder's, as ``Predictor.open`` read it (None: read here).

    Raises:
        ExportError: ONNX Runtime is not installed, or the folder has no model.onnx.
    """

    def __init__(self, folder: Path, config: PretrainedConfig | None = None):
        super().__init__()
        try:
            import onnxruntime as ort  # heavy, and only the ONNX forms need it
        except ImportError:
            raise ExportError("ONNX Runtime is not installed: bash .ci/setup (the lock has it), or "
                              "pip install onnxruntime") from None
        if not (folder / ONNX_FILE).is_file():
            raise ExportError(f"{folder / ONNX_FILE}: not found; run the export stage (dvc repro export) with this "
                              "form in export.forms")
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(folder / ONNX_FILE), options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.config = config or AutoConfig.from_pretrained(folder)

    def forward(self, **batch: torch.Tensor) -> SequenceClassifierOutput:
        feed = {name: np.asarray(batch[name], dtype=np.int64) for name in self.input_names}
        return SequenceClassifierOutput(logits=torch.from_numpy(self.session.run(["logits"], feed)[0]))


class OpenVinoClassifier(torch.nn.Module):
    """``folder``'s OpenVINO IR compiled for the CPU with its ``openvino.json`` precision hint and, where given,
    OpenVINO's ``performance_hint`` (``LATENCY``, ``THROUGHPUT``; None: OpenVINO's default); ``forward`` and
    ``config`` as ``OnnxClassifier``'s.

    Raises:
        ExportError: OpenVINO is not installed, or the folder has no openvino_model.xml.
    """

    def __init__(self, folder: Path, config: PretrainedConfig | None = None, performance_hint: str | None = None):
        super().__init__()
        try:
            import openvino as ov  # optional: the serve extra
        except ImportError:
            raise ExportError(f"OpenVINO is not installed: {SERVE_EXTRA}") from None
        if not (folder / OV_FILE).is_file():
            raise ExportError(f"{folder / OV_FILE}: not found; run the export stage (dvc repro export) with this "
                              "form in export.forms")
        hint = json.loads((folder / OV_CONFIG).read_text())["inference_precision"]
        settings = {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": torch.get_num_threads()}
        if performance_hint is not None:
            settings["PERFORMANCE_HINT"] = performance_hint
        self.compiled = ov.Core().compile_model(str(folder / OV_FILE), "CPU", settings)
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        self.config = config or AutoConfig.from_pretrained(folder)

    def forward(self, **batch: torch.Tensor) -> SequenceClassifierOutput:
        feed = {name: np.asarray(batch[name], dtype=np.int64) for name in self.input_names}
        return SequenceClassifierOutput(logits=torch.from_numpy(np.array(self.compiled(feed)[0], dtype=np.float32)))


def load_bf16(folder: Path, config: PretrainedConfig | None = None) -> PreTrainedModel:
    """The ``torch-bf16`` form in ``folder``; ``config`` as ``load_finetuned``'s.

    Raises:
        CheckpointError: the folder lacks config, weights or tokenizer.
    """
    return load_finetuned(folder, config).to(torch.bfloat16)
