"""Making the served forms of a fine-tuned model (the export stage; docs/serving.md): ONNX fp32, ONNX int8, bf16
PyTorch, and the OpenVINO forms of finetune/export/openvino.py. Running them is finetune/export/forms.py.

- ``onnx-fp32``: ``torch.onnx.export`` with the dynamo exporter (``torch.export`` then onnxscript), batch and
  sequence length dynamic, weights inside the one ``model.onnx``. Optimum's exporter would be the ecosystem's first
  choice, but optimum-onnx 0.1 requires transformers < 4.58 and optimum-intel 2.2 transformers < 5.6, so neither
  installs beside the locked 5.24 (checked on PyPI 2026-11-26). The TorchScript exporter (``dynamo=False``) traces
  the attention mask's branches for the example's shapes: its logits on other lengths were off by up to 0.23.
- ``onnx-int8``: ONNX Runtime's dynamic quantization (``onnxruntime.quantization.quantize_dynamic``): int8 weights,
  per output channel by default, activations quantized per batch at run time; only matmuls with a constant weight
  (``MatMulConstBOnly``: attention's activation x activation products stay fp32), and the modules named in
  ``export.int8.keep_fp32`` stay fp32 (on MRPC the attention's query, key and value projections: without that, 4
  more validation rows of 408 flipped; docs/serving.md).
  https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html
- ``torch-bf16``: the PyTorch model with bf16 weights (``save_pretrained`` after ``.to(torch.bfloat16)``), made
  only where the hardware computes bf16 natively (a GPU with bf16, a CPU with AVX512-BF16 or AMX); elsewhere bf16 is
  emulated and slower than fp32, so the form is skipped, saying so.
"""

from __future__ import annotations

import ast
import logging
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

if TYPE_CHECKING:
    from datasets import Dataset

from finetune.errors import ExportError
from finetune.export.openvino import (
    OPENVINO_FORMS,
    calibration_rows,
    openvino_missing,
    quantize_openvino,
    save_openvino,
)
from finetune.hardware import cpu_bf16_flags

log = logging.getLogger(__name__)

FORMS = ("onnx-fp32", "onnx-int8", "torch-bf16", *OPENVINO_FORMS)
ONNX_FILE = "model.onnx"
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # those the tokenizer gives, in this order
# Files of the model folder that every form carries beside its weights: tokenizer, config (labels) and task.json.
SIDE_FILES = ("config.json", "task.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "vocab.txt", "vocab.json", "merges.txt", "spm.model", "README.md")


class LogitsOnly(torch.nn.Module):
    """``model``'s logits ``[batch, num_labels]`` from named tensors ``[batch, seq_len]``: the one output the
    ONNX graph has."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits


def model_inputs(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The inputs the ONNX graph takes: those of ``MODEL_INPUTS`` that ``tokenizer`` produces (RoBERTa, DistilBERT
    and MPNet give no ``token_type_ids``)."""
    return [name for name in MODEL_INPUTS if name in tokenizer.model_input_names]


def copy_side_files(model_dir: Path, form_dir: Path) -> None:
    """Copy the tokenizer, config.json, task.json and the model card of ``model_dir`` into ``form_dir``, so each form
    loads on its own."""
    form_dir.mkdir(parents=True, exist_ok=True)
    for name in SIDE_FILES:
        if (model_dir / name).exists():
            shutil.copy2(model_dir / name, form_dir / name)


def export_onnx(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path, opset: int) -> Path:
    """Write ``model`` (fp32, eval mode) to ``path`` as one ONNX file: inputs ``model_inputs(tokenizer)``, each
    ``[batch, seq_len]`` int64 with both axes dynamic; output ``logits [batch, num_labels]`` float32.

    The example input is two pairs of different lengths, padded, so that neither axis is specialised to 1 and the
    attention mask's padding path is the one exported.

    Raises:
        ExportError: the exporter can't handle the model; the message names its model type.
    """
    names = model_inputs(tokenizer)
    example = tokenizer(["A short first sentence.", "A second, rather longer sentence with more words in it."],
                        ["And its pair.", "Short."], padding=True, return_tensors="pt")
    kwargs = {name: example[name] for name in names}
    dynamic = {name: {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC} for name in names}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's deprecation and tracing notes
            torch.onnx.export(LogitsOnly(model.float().eval()), (), str(path), kwargs=kwargs, input_names=names,
                              output_names=["logits"], dynamic_shapes=dynamic, opset_version=opset, dynamo=True,
                              external_data=False, verbose=False)
    except Exception as err:  # torch.export's and onnxscript's many error types
        raise ExportError(f"export.forms onnx-fp32: torch.onnx.export can't export model type "
                          f"{model.config.model_type!r}: {type(err).__name__}: {str(err).splitlines()[0][:300]}; "
                          "remove the ONNX forms from export.forms for this model") from None
    drop_stack_traces(path)
    return path


def drop_stack_traces(path: Path) -> None:
    """Remove the exporter's per-node Python stack traces (``pkg.torch.onnx.stack_trace``) from the ONNX file: they
    hold this checkout's absolute paths, so the same model exported in two clones differed in bytes and size. The
    module names (``pkg.torch.onnx.name_scopes``, read by ``module_of``) stay."""
    import onnx

    graph = onnx.load(str(path))
    for node in graph.graph.node:
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(graph, str(path))


def module_of(node) -> str:
    """The PyTorch module an ONNX node came from, e.g. ``bert.encoder.layer.0.attention.self.query``; '' when unknown.

    The dynamo exporter's ``pkg.torch.onnx.name_scopes`` metadata lists the module paths from the root down, then
    the op (``['', 'model', 'model.bert', ..., 'model.bert.encoder.layer.0.attention.self.query', 'linear']``); the
    deepest module less ``LogitsOnly``'s ``model.`` is the name.
    """
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            modules = [scope for scope in ast.literal_eval(prop.value) if scope.startswith("model.")]
            return modules[-1].removeprefix("model.") if modules else ""
    return ""


def quantize_int8(fp32_path: Path, int8_path: Path, per_channel: bool, keep_fp32: list[str]) -> list[str]:
    """Write ``fp32_path``'s model with int8 weights to ``int8_path`` (ONNX Runtime dynamic quantization).

    Args:
        per_channel: one scale per output channel of each weight (else one per tensor).
        keep_fp32: module names kept fp32: a matmul stays fp32 when its module's name is one of these or ends with
            ``.<name>`` (e.g. ``query`` matches ``bert.encoder.layer.0.attention.self.query``).

    Returns:
        The modules kept fp32 (a WARNING when ``keep_fp32`` is not empty and matches none).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(fp32_path)).graph
    kept_nodes, kept_modules = [], []
    for node in graph.node:
        module = module_of(node)
        if node.op_type in ("MatMul", "Gemm") and any(module == k or module.endswith(f".{k}") for k in keep_fp32):
            kept_nodes.append(node.name)
            kept_modules.append(module)
    if keep_fp32 and not kept_nodes:
        log.warning("export.int8.keep_fp32 %s matches no module of this model: every matmul is int8", keep_fp32)
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR  # the quantizer logs a line per node (and advice) to the root logger
    try:
        quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=per_channel,
                         nodes_to_exclude=kept_nodes, extra_options={"MatMulConstBOnly": True})
    finally:
        root.setLevel(level)
    return sorted(set(kept_modules))


def bf16_unsupported() -> str | None:
    """Why bf16 would be emulated here (None where the hardware has it): no GPU with bf16, and a CPU without
    AVX512-BF16 or AMX-BF16 (``/proc/cpuinfo``)."""
    if torch.cuda.is_available():
        return None if torch.cuda.is_bf16_supported() else f"{torch.cuda.get_device_name()} has no bf16"
    return None if cpu_bf16_flags() else "this CPU has no AVX512-BF16 or AMX-BF16: bf16 would be emulated, slower " \
                                         "than fp32"


def save_bf16(model: PreTrainedModel, folder: Path) -> Path:
    """Save a bf16 copy of ``model`` into ``folder`` (``save_pretrained``; half the size of fp32)."""
    model.to(torch.bfloat16).save_pretrained(folder)
    model.float()
    return folder


def file_size_mb(folder: Path) -> float:
    """The weights' size in MB (10^6 bytes): ``model.onnx``, the OpenVINO ``.bin`` or the safetensors files of
    ``folder``."""
    files = [folder / ONNX_FILE] if (folder / ONNX_FILE).exists() else \
        list(folder.glob("*.bin")) + list(folder.glob("*.safetensors"))
    return round(sum(f.stat().st_size for f in files) / 1e6, 2)


def make_forms(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, model_dir: Path, out_dir: Path, p,
               train: Dataset | None = None) -> dict[str, dict]:
    """Make each form of ``p.forms`` (the ``export`` params) of ``model`` (saved in ``model_dir``) in
    ``out_dir / <form>``, with ``model_dir``'s side files. ONNX int8 and the OpenVINO forms start from the fp32 ONNX
    file, kept only when ``onnx-fp32`` is asked for; OpenVINO int8 is calibrated on rows of ``train`` (the tokenized
    train split).

    Returns:
        Per form ``{"skipped": why}`` (bf16 without the hardware, OpenVINO not installed), ``{"kept_fp32_matmuls":
        n}`` (ONNX int8), the calibration (OpenVINO int8) or ``{}``.

    Raises:
        ExportError: the exporter or the quantizer can't handle the model (``export_onnx``, ``quantize_openvino``).
    """
    made, missing = {}, openvino_missing() if any(f in OPENVINO_FORMS for f in p.forms) else None
    fp32_onnx = out_dir / "onnx-fp32" / ONNX_FILE
    if any(form.startswith("onnx") or (form in OPENVINO_FORMS and not missing) for form in p.forms):
        log.info("onnx-fp32: exporting with torch.onnx.export (dynamo)")
        copy_side_files(model_dir, fp32_onnx.parent)
        export_onnx(model, tokenizer, fp32_onnx, p.opset)
    for form in p.forms:
        why = (bf16_unsupported() if form.endswith("bf16") else None) or (missing if form in OPENVINO_FORMS else None)
        if why:
            (log.warning if why == missing else log.info)("%s: skipped: %s", form, why)
            made[form] = {"skipped": why}
            continue
        copy_side_files(model_dir, out_dir / form)
        made[form] = {}
        if form == "onnx-int8":
            log.info("%s: quantizing with onnxruntime.quantization.quantize_dynamic", form)
            kept = quantize_int8(fp32_onnx, out_dir / form / ONNX_FILE, p.int8.per_channel, p.int8.keep_fp32)
            log.info("%s: %d matmuls kept fp32 (export.int8.keep_fp32): %s", form, len(kept), kept)
            made[form]["kept_fp32_matmuls"] = len(kept)
        elif form == "torch-bf16":
            save_bf16(model, out_dir / form)
        elif form == "openvino-int8":
            samples = calibration_rows(train, p.openvino.calibration_rows, p.openvino.seed, model_inputs(tokenizer))
            log.info("%s: quantizing with nncf.quantize, calibrated on %d train rows", form, len(samples))
            made[form] = quantize_openvino(fp32_onnx, out_dir / form, samples, p.openvino.seed)
        elif form in OPENVINO_FORMS:
            save_openvino(fp32_onnx, out_dir / form, "bf16" if form == "openvino-bf16" else "f32")
    if "onnx-fp32" not in p.forms:
        shutil.rmtree(fp32_onnx.parent, ignore_errors=True)
    return made
