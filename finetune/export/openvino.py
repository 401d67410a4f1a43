"""The export stage's makers of the OpenVINO forms, from the ``onnx-fp32`` form's file (docs/serving.md). Each
folder holds ``openvino_model.xml``/``.bin``, ``openvino.json`` (the precision hint, and int8's calibration) and the
side files. They need ``openvino`` and ``nncf`` (the ``serve`` extra).

- ``openvino-fp32``: ``openvino.convert_model`` saved as IR, run with ``INFERENCE_PRECISION_HINT`` f32 (the CPU
  plugin would otherwise pick bf16 on a CPU with AVX512-BF16 or AMX).
- ``openvino-bf16``: the same IR run with the hint bf16; made only where the CPU computes bf16.
- ``openvino-int8``: ``nncf.quantize`` (``ModelType.TRANSFORMER``) calibrated on ``export.openvino.calibration_rows``
  train rows, never validation or test rows.
  https://docs.openvino.ai/2026/openvino-workflow/model-optimization-guide/quantizing-models-post-training/basic-quantization-flow.html
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from finetune.errors import ExportError, first_line
from finetune.export.make import MakeJob, model_inputs
from finetune.inference.runtimes import ONNX_FILE, OV_CONFIG, OV_FILE, SERVE_EXTRA

if TYPE_CHECKING:
    from datasets import Dataset

log = logging.getLogger(__name__)


def openvino_missing() -> str | None:
    """Why the OpenVINO forms can't be made here, naming the extra to install; None when they can."""
    missing = [name for name in ("openvino", "nncf") if importlib.util.find_spec(name) is None]
    return f"{' and '.join(missing)} not installed: {SERVE_EXTRA}" if missing else None


def save_openvino(model, folder: Path, precision: str = "f32", **record) -> Path:
    """Save ``model`` (an ONNX file's path or an OpenVINO model) as IR in ``folder``, with an ``openvino.json`` of
    ``precision`` (the ``INFERENCE_PRECISION_HINT``, f32 or bf16) and ``record``.

    Raises:
        ExportError: OpenVINO can't convert the ONNX file; naming it and OpenVINO's first line.
    """
    import openvino as ov  # optional: the serve extra

    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(model, Path):
        try:
            model = ov.convert_model(str(model))
        except Exception as err:  # OpenVINO's many error types
            raise ExportError(f"export.forms {folder.name}: openvino.convert_model can't convert {model}: "
                              f"{first_line(err)}; remove the OpenVINO forms "
                              "from export.forms for this model") from None
    ov.save_model(model, str(folder / OV_FILE), compress_to_fp16=False)
    (folder / OV_CONFIG).write_text(json.dumps({"inference_precision": precision, **record}, indent=2) + "\n")
    return folder


def calibration_rows(train: Dataset, rows: int, seed: int, inputs: list[str]) -> list[dict[str, np.ndarray]]:
    """NNCF's calibration samples: ``rows`` rows of ``train`` drawn with ``seed`` (all when fewer), each the
    ``inputs`` as int64 ``[1, seq_len]``."""
    picked = np.sort(np.random.default_rng(seed).permutation(len(train))[:rows])
    return [{name: np.asarray([row[name]], dtype=np.int64) for name in inputs}
            for row in train.select(picked).select_columns(inputs)]


def quantize_openvino(onnx_path: Path, folder: Path, samples: list[dict[str, np.ndarray]], seed: int) -> dict:
    """Quantize ``onnx_path`` to int8 with ``nncf.quantize`` on ``samples`` and save it as IR in ``folder``.

    Returns:
        ``{"calibration_rows", "calibration_seed", "nncf"}`` (NNCF's version), also in ``openvino.json``.

    Raises:
        ExportError: NNCF fails on the model.
    """
    import nncf  # optional: the serve extra
    import openvino as ov  # optional: the serve extra

    try:
        quantized = nncf.quantize(ov.convert_model(str(onnx_path)), nncf.Dataset(samples),
                                  model_type=nncf.ModelType.TRANSFORMER, subset_size=len(samples))
    except Exception as err:  # NNCF's and OpenVINO's many error types
        raise ExportError(f"export.forms openvino-int8: nncf.quantize failed: {first_line(err)}; remove "
                          "openvino-int8 from export.forms") from None
    record = {"calibration_rows": len(samples), "calibration_seed": seed, "nncf": nncf.__version__}
    save_openvino(quantized, folder, "f32", **record)
    return record


def make_openvino_fp32(job: MakeJob) -> dict:
    """The ``openvino-fp32`` form: the base's ONNX file as IR, hint f32.

    Raises:
        ExportError: OpenVINO can't convert the file (``save_openvino``).
    """

    save_openvino(job.base / ONNX_FILE, job.folder, "f32")
    return {}


def make_openvino_bf16(job: MakeJob) -> dict:
    """The ``openvino-bf16`` form: the base's ONNX file as IR, hint bf16.

    Raises:
        ExportError: OpenVINO can't convert the file (``save_openvino``).
    """

    save_openvino(job.base / ONNX_FILE, job.folder, "bf16")
    return {}


def make_openvino_int8(job: MakeJob) -> dict:
    """The ``openvino-int8`` form: ``quantize_openvino`` of the base's file on ``job.train``; returns its record.

    Raises:
        ExportError: NNCF fails on the model.
    """
    p = job.params.openvino
    samples = calibration_rows(job.train, p.calibration_rows, p.seed, model_inputs(job.tokenizer))
    log.info("%s: quantizing with nncf.quantize, calibrated on %d train rows", job.form, len(samples))
    return quantize_openvino(job.base / ONNX_FILE, job.folder, samples, p.seed)
