"""Making the OpenVINO served forms (the export stage; docs/serving.md), from the fp32 ONNX file of finetune/export/make.py.
Running them is finetune/export/forms.py (``OpenVinoClassifier``).

- ``openvino-fp32``: ``openvino.convert_model`` of the ONNX file, saved as OpenVINO IR (``ov.save_model``: an .xml
  graph and a .bin of fp32 weights), run with ``INFERENCE_PRECISION_HINT`` f32 (OpenVINO's CPU plugin would pick
  bf16 by itself on a CPU with AVX512-BF16 or AMX).
- ``openvino-bf16``: the same IR run with the hint bf16, made only where the CPU computes bf16 (as ``torch-bf16``).
- ``openvino-int8``: NNCF post-training quantization (``nncf.quantize`` with ``ModelType.TRANSFORMER``: int8 matmuls,
  SmoothQuant and bias correction), calibrated on ``export.openvino.calibration_rows`` train rows drawn with
  ``export.openvino.seed``; never validation or test rows. https://docs.openvino.ai/2026/openvino-workflow/
  model-optimization-guide/quantizing-models-post-training/basic-quantization-flow.html

Optimum-intel would wrap the same calls, but pins transformers below 5.6; OpenVINO and NNCF have no such pin.
Each form folder holds ``openvino_model.xml``/``.bin``, ``openvino.json`` (the precision hint it runs with, and for
int8 how it was calibrated) and the side files (tokenizer, config, task.json, card).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from datasets import Dataset

log = logging.getLogger(__name__)

OPENVINO_FORMS = ("openvino-fp32", "openvino-bf16", "openvino-int8")
OV_FILE = "openvino_model.xml"  # with openvino_model.bin beside it
OV_CONFIG = "openvino.json"  # {"inference_precision": "f32" | "bf16", ...}
SERVE_EXTRA = "pip install -e '.[serve]' (or bash .ci/setup: the lock has it)"


def openvino_missing() -> str | None:
    """Why the OpenVINO forms can't be made here (None when OpenVINO and NNCF import): the extra to install."""
    missing = [name for name in ("openvino", "nncf") if importlib.util.find_spec(name) is None]
    return f"{' and '.join(missing)} not installed: {SERVE_EXTRA}" if missing else None


def save_openvino(model, folder: Path, precision: str = "f32", **record) -> Path:
    """``model`` (an ONNX file's path, converted with ``openvino.convert_model``, or an OpenVINO model) saved as IR in
    ``folder`` with its ``openvino.json`` (``precision``: the ``INFERENCE_PRECISION_HINT`` it runs with, f32 or bf16;
    ``record``: more to write there)."""
    import openvino as ov

    folder.mkdir(parents=True, exist_ok=True)
    model = ov.convert_model(str(model)) if isinstance(model, Path) else model
    ov.save_model(model, str(folder / OV_FILE), compress_to_fp16=False)
    (folder / OV_CONFIG).write_text(json.dumps({"inference_precision": precision, **record}, indent=2) + "\n")
    return folder


def calibration_rows(train: Dataset, rows: int, seed: int, inputs: list[str]) -> list[dict[str, np.ndarray]]:
    """``rows`` rows of the tokenized train split ``train`` drawn with ``seed`` (all of them when it has fewer), each
    as the model's ``inputs`` of one example, int64 ``[1, seq_len]``: NNCF's calibration samples."""
    picked = np.sort(np.random.default_rng(seed).permutation(len(train))[:rows])
    return [{name: np.asarray([row[name]], dtype=np.int64) for name in inputs}
            for row in train.select(picked).select_columns(inputs)]


def quantize_openvino(onnx_path: Path, folder: Path, samples: list[dict[str, np.ndarray]], seed: int) -> dict:
    """``onnx_path`` quantized to int8 with NNCF (``nncf.quantize``, ``ModelType.TRANSFORMER``, its default
    ``preset``) on ``samples`` (``calibration_rows``), saved as IR in ``folder`` with its ``openvino.json``.

    Returns:
        What export.json records: ``calibration_rows``, ``calibration_seed`` and NNCF's version.

    Raises:
        ExportError: NNCF fails on the model; the message says so and names the form.
    """
    import nncf
    import openvino as ov

    from finetune.errors import ExportError

    try:
        quantized = nncf.quantize(ov.convert_model(str(onnx_path)), nncf.Dataset(samples),
                                  model_type=nncf.ModelType.TRANSFORMER, subset_size=len(samples))
    except Exception as err:  # NNCF's and OpenVINO's many error types
        raise ExportError(f"export.forms openvino-int8: nncf.quantize failed: {type(err).__name__}: "
                          f"{str(err).splitlines()[0][:300]}; remove openvino-int8 from export.forms") from None
    record = {"calibration_rows": len(samples), "calibration_seed": seed, "nncf": nncf.__version__}
    save_openvino(quantized, folder, "f32", **record)
    return record
