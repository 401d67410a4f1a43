"""The served forms' registry (docs/serving.md): what ``export.forms`` is validated against, and what the export
stage makes and ``finetune.inference`` loads.

Makers, loaders and checks are ``"module:function"`` strings imported only when called (``resolve``): every stage
imports this module through finetune/params.py, and none may depend on the export code, torch or ONNX.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

PYTORCH = "pytorch"  # the fine-tuned model as trained (models/finetuned, fp32): the reference, not a made form


@dataclass(frozen=True)
class Need:
    """Something a form needs on the machine that makes and runs it.

    Attributes:
        kind: a form skipped for want of ``hardware`` is logged at INFO, of a ``package`` as a WARNING.
        check: ``"module:function"`` of ``() -> str | None``: why the need is not met here, None when it is.
    """

    kind: Literal["hardware", "package"]
    check: str


NATIVE_BF16 = Need("hardware", "finetune.export.make:bf16_unsupported")  # a GPU with bf16, or AVX512-BF16 / AMX-BF16
OPENVINO = Need("package", "finetune.export.openvino:openvino_missing")  # openvino and nncf (the serve extra)


@dataclass(frozen=True)
class Form:
    """One served form, made into ``models/exported/<name>/``.

    Attributes:
        make: ``"module:function"`` of ``(job: MakeJob) -> dict``: writes the weights into ``job.folder`` and returns
            what metrics/export.json records beyond parity.
        load: ``"module:function"`` of ``(folder: Path) -> torch.nn.Module`` whose
            ``forward(**batch)`` takes ``[batch, seq_len]`` tensors and returns ``.logits [batch, num_labels]``, with
            ``config`` from the folder.
        lossy: False: logits must equal PyTorch's within ``export.fp32_tolerance`` (else the stage fails); True:
            flagged beyond ``export.max_metric_drop``.
        loaded_with: how a user loads it, for the model card.
        base: the form this one is made from, made first and removed when ``export.forms`` omits it.
        pytorch_module: a torch module, which ``finetune.inference.Predictor`` moves to its device or accelerator;
            else it runs on the CPU.
    """

    name: str
    make: str
    load: str
    lossy: bool
    loaded_with: str
    needs: tuple[Need, ...] = ()
    base: str | None = None
    pytorch_module: bool = False


_ONNX, _OPENVINO = "finetune.inference.runtimes:OnnxClassifier", "finetune.inference.runtimes:OpenVinoClassifier"
_ONNX_LOAD = 'onnxruntime.InferenceSession("model.onnx")'
_OPENVINO_LOAD = 'openvino.compile_model("openvino_model.xml", "CPU", <openvino.json\'s hint>)'

FORMS: dict[str, Form] = {form.name: form for form in (
    Form("onnx-fp32", "finetune.export.make:make_onnx_fp32", _ONNX, lossy=False,
         loaded_with=_ONNX_LOAD),
    Form("onnx-int8", "finetune.export.make:make_onnx_int8", _ONNX, lossy=True,
         loaded_with=_ONNX_LOAD, base="onnx-fp32"),
    Form("torch-bf16", "finetune.export.make:make_torch_bf16", "finetune.inference.runtimes:load_bf16", lossy=True,
         loaded_with="AutoModelForSequenceClassification.from_pretrained(folder)  # bf16 weights",
         needs=(NATIVE_BF16,), pytorch_module=True),
    Form("openvino-fp32", "finetune.export.openvino:make_openvino_fp32", _OPENVINO,
         lossy=False, loaded_with=_OPENVINO_LOAD, needs=(OPENVINO,), base="onnx-fp32"),
    Form("openvino-bf16", "finetune.export.openvino:make_openvino_bf16", _OPENVINO,
         lossy=True, loaded_with=_OPENVINO_LOAD, needs=(NATIVE_BF16, OPENVINO), base="onnx-fp32"),
    Form("openvino-int8", "finetune.export.openvino:make_openvino_int8", _OPENVINO,
         lossy=True, loaded_with=_OPENVINO_LOAD, needs=(OPENVINO,), base="onnx-fp32"),
)}


def register(form: Form) -> Form:
    """Add ``form`` to ``FORMS`` for this process, like the built-in forms.

    Raises:
        ValueError: a form of that name is registered, or its base is not.
    """
    if form.name in FORMS or form.name == PYTORCH:
        raise ValueError(f"form {form.name!r} is already registered")
    if form.base is not None and form.base not in FORMS:
        raise ValueError(f"form {form.name!r}: its base {form.base!r} is not a registered form")
    FORMS[form.name] = form
    return form


def expected() -> str:
    """The registered names as pydantic lists a Literal's: ``'onnx-fp32', 'onnx-int8', ... or 'openvino-int8'``."""
    names = [repr(name) for name in FORMS]
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)


def resolve(reference: str) -> Any:
    """The object a ``"module:function"`` reference names, importing its module."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def loader(name: str) -> Any:
    """The loader of form ``name``: ``(folder) -> torch.nn.Module`` (``Form.load``)."""
    return resolve(FORMS[name].load)


def unmet(name: str) -> tuple[Need, str] | None:
    """The first unmet need of form ``name`` or its bases, with why; None when all are met."""
    form = FORMS[name]
    for need in form.needs:
        if why := resolve(need.check)():
            return need, why
    return unmet(form.base) if form.base is not None else None


def referenced_modules() -> list[str]:
    """The modules of the entries' makers, loaders and checks (code that imports don't reach)."""
    refs = {ref for form in FORMS.values() for ref in (form.make, form.load, *(n.check for n in form.needs))}
    return sorted({ref.partition(":")[0] for ref in refs})
