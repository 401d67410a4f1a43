"""The export stage's makers of the ONNX and PyTorch forms, which finetune/export/registry.py names
(docs/serving.md, "Why these tools").

- ``onnx-fp32``: ``torch.onnx.export``, dynamo exporter; batch and sequence length dynamic; one ``model.onnx``.
- ``onnx-int8``: ``onnxruntime.quantization.quantize_dynamic`` of the fp32 file: int8 weights, activations quantized
  per batch at run time; only matmuls with a constant weight (``MatMulConstBOnly``), less the attention projections
  whose roles ``export.int8.keep_fp32`` names (``ATTENTION_PROJECTIONS``).
  https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html
- ``torch-bf16``: ``save_pretrained`` of the bf16 model; skipped where bf16 would be emulated (``bf16_unsupported``).
"""

from __future__ import annotations

import ast
import logging
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

if TYPE_CHECKING:
    from datasets import Dataset

    from finetune.params import ExportParams

from finetune.data.batches import MODEL_INPUTS
from finetune.errors import ExportError, first_line
from finetune.hardware import cpu_bf16_flags
from finetune.inference.runtimes import ONNX_FILE
from finetune.modeling import MeanPooledConfig

log = logging.getLogger(__name__)

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
    """Those of ``MODEL_INPUTS`` that ``tokenizer`` produces (RoBERTa, DistilBERT, MPNet: no ``token_type_ids``)."""
    return [name for name in MODEL_INPUTS if name in tokenizer.model_input_names]


def copy_side_files(model_dir: Path, form_dir: Path) -> None:
    """Copy ``model_dir``'s ``SIDE_FILES`` into ``form_dir``, so each form loads on its own."""
    form_dir.mkdir(parents=True, exist_ok=True)
    for name in SIDE_FILES:
        if (model_dir / name).exists():
            shutil.copy2(model_dir / name, form_dir / name)


def export_onnx(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path, opset: int) -> Path:
    """Write ``model`` (fp32, eval mode) to ``path`` as one ONNX file: inputs ``model_inputs(tokenizer)``, each
    ``[batch, seq_len]`` int64 with both axes dynamic; output ``logits [batch, num_labels]`` float32.

    Raises:
        ExportError: the exporter can't handle the model; the message names its model type.
    """
    names = model_inputs(tokenizer)
    # two pairs of different lengths, padded: no axis specialised to 1, and the padding path is the one exported
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
                          f"{model.config.model_type!r}: {first_line(err)}; "
                          "remove the ONNX forms from export.forms for this model") from None
    drop_stack_traces(path)
    return path


def drop_stack_traces(path: Path) -> None:
    """Remove the per-node ``pkg.torch.onnx.stack_trace`` metadata (this checkout's absolute paths, so exports from
    two clones would differ); ``pkg.torch.onnx.name_scopes`` stays for ``module_of``."""
    import onnx  # heavy, and only the ONNX forms need it

    graph = onnx.load(str(path))
    for node in graph.graph.node:
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(graph, str(path))


def module_of(node) -> str:
    """The PyTorch module an ONNX node came from, e.g. ``bert.encoder.layer.0.attention.self.query``; '' when unknown.
    Read from ``pkg.torch.onnx.name_scopes``: the deepest ``model.*`` scope less ``LogitsOnly``'s ``model.``."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            modules = [scope for scope in ast.literal_eval(prop.value) if scope.startswith("model.")]
            return modules[-1].removeprefix("model.") if modules else ""
    return ""


# The attention's query, key and value projections of each encoder family, by role (``export.int8.keep_fp32``): the
# last part of their module names in transformers' modeling_<family>.py, one per role; a fused projection serves all
# three (ModernBERT's Wqkv). A family not listed is read with BERT's names (XLM-RoBERTa, CamemBERT, ALBERT, ...);
# ``quantize_int8`` stops naming the family when a role's module is not in its graph.
ROLES = ("query", "key", "value")
_BERT = ("query", "key", "value")
_PROJ = ("q_proj", "k_proj", "v_proj")
ATTENTION_PROJECTIONS = {
    "bert": _BERT, "roberta": _BERT, "electra": _BERT,
    "distilbert": ("q_lin", "k_lin", "v_lin"),
    "deberta-v2": ("query_proj", "key_proj", "value_proj"),
    "mpnet": ("q", "k", "v"),
    "modernbert": ("Wqkv", "Wqkv", "Wqkv"),
    "eurobert": _PROJ, "gte": _PROJ, "nomic_bert": _PROJ, "jina_embeddings_v3": _PROJ,
}


def encoder_type(config) -> str:
    """The encoder's model type of a classifier's config: its own, or a mean-pooled model's encoder's."""
    return config.encoder.model_type if config.model_type == MeanPooledConfig.model_type else config.model_type


def quantize_int8(fp32_path: Path, int8_path: Path, per_channel: bool, keep_fp32: list[str],
                  model_type: str) -> list[str]:
    """Write ``fp32_path``'s model with int8 weights to ``int8_path``; return the modules kept fp32.

    Args:
        per_channel: one scale per output channel of each weight (else one per tensor).
        keep_fp32: roles of ``ROLES``: the matmuls of the attention projections in those roles stay fp32, found by
            the ``model_type`` encoder's names (``ATTENTION_PROJECTIONS``), a module whose name ends with
            ``.<name>``.

    Raises:
        ExportError: a role's projection is not in the graph (the family names it otherwise); naming the model type,
            the role and the name looked for.
    """
    import onnx  # heavy, and only the ONNX forms need it
    from onnxruntime.quantization import QuantType, quantize_dynamic  # heavy, only the int8 form needs it

    names = ATTENTION_PROJECTIONS.get(model_type, _BERT)
    wanted = {role: names[ROLES.index(role)] for role in keep_fp32}
    kept_nodes, kept_modules = [], set()
    for node in onnx.load(str(fp32_path)).graph.node:
        module = module_of(node)
        if node.op_type in ("MatMul", "Gemm") and any(module.endswith(f".{name}") for name in wanted.values()):
            kept_nodes.append(node.name)
            kept_modules.add(module)
    missing = [role for role, name in wanted.items() if not any(m.endswith(f".{name}") for m in kept_modules)]
    if missing:
        known = "is" if model_type in ATTENTION_PROJECTIONS else "is not"
        raise ExportError(f"export.int8.keep_fp32: model type {model_type!r} has no attention {missing[0]} projection "
                          f"named {wanted[missing[0]]!r} (its family {known} in ATTENTION_PROJECTIONS, "
                          "finetune/export/make.py); add its names there, or set export.int8.keep_fp32: [] to make "
                          "every matmul int8")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs a line per node (and advice) to the root logger
    try:
        quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=per_channel,
                         nodes_to_exclude=kept_nodes, extra_options={"MatMulConstBOnly": True})
    finally:
        root.setLevel(level)
    return sorted(kept_modules)


def bf16_unsupported() -> str | None:
    """Why bf16 would be emulated here (no GPU with bf16, no AVX512-BF16 or AMX-BF16); None where it is native."""
    if torch.cuda.is_available():
        return None if torch.cuda.is_bf16_supported() else f"{torch.cuda.get_device_name()} has no bf16"
    return None if cpu_bf16_flags() else "this CPU has no AVX512-BF16 or AMX-BF16: bf16 would be emulated, slower " \
                                         "than fp32"


def save_bf16(model: PreTrainedModel, folder: Path) -> Path:
    """Save a bf16 copy of ``model`` into ``folder``; ``model`` keeps its fp32 weights for the forms made after."""
    fp32 = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model.to(torch.bfloat16).save_pretrained(folder)
    model.float().load_state_dict(fp32)  # .float() alone would keep the bf16 rounding
    return folder


def file_size_mb(folder: Path) -> float:
    """The size in MB (10^6 bytes) of ``folder``'s ``model.onnx``, else its ``.bin`` and ``.safetensors`` files."""
    files = [folder / ONNX_FILE] if (folder / ONNX_FILE).exists() else \
        list(folder.glob("*.bin")) + list(folder.glob("*.safetensors"))
    return round(sum(f.stat().st_size for f in files) / 1e6, 2)


@dataclass(frozen=True)
class MakeJob:
    """What a form's maker (the registry's ``Form.make``) gets.

    Attributes:
        model: fp32 in eval mode; a maker that changes it puts it back as it was.
        folder: ``<exported>/<form>``, holding the side files; the maker writes the weights there.
        base: the folder of the entry's ``base`` form, made before this one.
        train: the tokenized train split (calibration rows).
    """

    form: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    folder: Path
    base: Path | None
    params: ExportParams
    train: Dataset | None = None


def make_onnx_fp32(job: MakeJob) -> dict:
    """The ``onnx-fp32`` form: ``export_onnx`` of the model into ``job.folder``."""
    log.info("%s: exporting with torch.onnx.export (dynamo)", job.form)
    export_onnx(job.model, job.tokenizer, job.folder / ONNX_FILE, job.params.opset)
    return {}


def make_onnx_int8(job: MakeJob) -> dict:
    """The ``onnx-int8`` form: ``quantize_int8`` of the base's file; returns ``{"kept_fp32_matmuls": n}``.

    Raises:
        ExportError: ``export.int8.keep_fp32`` names a role whose projection the model's family names otherwise.
    """
    log.info("%s: quantizing with onnxruntime.quantization.quantize_dynamic", job.form)
    p = job.params.int8
    kept = quantize_int8(job.base / ONNX_FILE, job.folder / ONNX_FILE, p.per_channel, p.keep_fp32,
                         encoder_type(job.model.config))
    log.info("%s: %d matmuls kept fp32 (export.int8.keep_fp32): %s", job.form, len(kept), kept)
    return {"kept_fp32_matmuls": len(kept)}


def make_torch_bf16(job: MakeJob) -> dict:
    """The ``torch-bf16`` form: ``save_bf16`` of the model into ``job.folder``."""
    save_bf16(job.model, job.folder)
    return {}
