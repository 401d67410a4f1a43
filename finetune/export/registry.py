"""The served forms' registry (docs/serving.md): each form's maker, loader, needs and parity rule, which the export
stage makes and checks and ``tools.predict``, ``tools.serve`` and the serving benchmarks open.

Only the export stage and the serving tools import this module, so adding a form (its module and an entry here)
reruns the export stage and nothing before it: ``export.forms`` is checked against ``FORMS`` by the export stage
(``check_forms``), not by the params schema every stage loads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from finetune.errors import ExportError, ParamsError
from finetune.export.make import MakeJob, bf16_unsupported, make_onnx_fp32, make_onnx_int8, make_torch_bf16
from finetune.export.openvino import make_openvino_bf16, make_openvino_fp32, make_openvino_int8, openvino_missing
from finetune.inference.predictor import PYTORCH, Predictor
from finetune.inference.runtimes import OnnxClassifier, OpenVinoClassifier, load_bf16
from finetune.modeling import load_finetuned


@dataclass(frozen=True)
class Need:
    """Something a form needs on the machine that makes and runs it.

    Attributes:
        kind: a form skipped for want of ``hardware`` is logged at INFO, of a ``package`` as a WARNING.
        check: why the need is not met here, None when it is.
    """

    kind: Literal["hardware", "package"]
    check: Callable[[], str | None]


NATIVE_BF16 = Need("hardware", bf16_unsupported)  # a GPU with bf16, or AVX512-BF16 / AMX-BF16
OPENVINO = Need("package", openvino_missing)  # openvino and nncf (the serve extra)


@dataclass(frozen=True)
class Form:
    """One served form, made into ``models/exported/<name>/``.

    Attributes:
        make: writes the weights into ``job.folder`` and returns what metrics/export.json records beyond parity.
        load: the classifier in a folder, ``(folder, config) -> torch.nn.Module`` (``config``: the folder's, read
            once by ``Predictor.open``; None: read by the loader): a module whose ``forward(**batch)`` takes
            ``[batch, seq_len]`` tensors and returns ``.logits [batch, num_labels]``, with that ``config``. One with
            torch parameters is moved to the Predictor's device; one without (a runtime's session) runs on the CPU.
        lossy: False: logits must equal PyTorch's within ``export.fp32_tolerance`` (else the stage fails); True:
            flagged beyond ``export.max_metric_drop``.
        loaded_with: how a user loads it, for the model card.
        base: the form this one is made from, made first and removed when ``export.forms`` omits it.
    """

    name: str
    make: Callable[[MakeJob], dict]
    load: Callable[..., torch.nn.Module]
    lossy: bool
    loaded_with: str
    needs: tuple[Need, ...] = ()
    base: str | None = None


_ONNX_LOAD = 'onnxruntime.InferenceSession("model.onnx")'
_OPENVINO_LOAD = 'openvino.compile_model("openvino_model.xml", "CPU", <openvino.json\'s hint>)'

FORMS: dict[str, Form] = {form.name: form for form in (
    Form("onnx-fp32", make_onnx_fp32, OnnxClassifier, lossy=False, loaded_with=_ONNX_LOAD),
    Form("onnx-int8", make_onnx_int8, OnnxClassifier, lossy=True, loaded_with=_ONNX_LOAD, base="onnx-fp32"),
    Form("torch-bf16", make_torch_bf16, load_bf16, lossy=True,
         loaded_with="AutoModelForSequenceClassification.from_pretrained(folder)  # bf16 weights",
         needs=(NATIVE_BF16,)),
    Form("openvino-fp32", make_openvino_fp32, OpenVinoClassifier, lossy=False, loaded_with=_OPENVINO_LOAD,
         needs=(OPENVINO,), base="onnx-fp32"),
    Form("openvino-bf16", make_openvino_bf16, OpenVinoClassifier, lossy=True, loaded_with=_OPENVINO_LOAD,
         needs=(NATIVE_BF16, OPENVINO), base="onnx-fp32"),
    Form("openvino-int8", make_openvino_int8, OpenVinoClassifier, lossy=True, loaded_with=_OPENVINO_LOAD,
         needs=(OPENVINO,), base="onnx-fp32"),
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


def check_forms(forms: list[str]) -> None:
    """Check ``export.forms`` against the registered names, as pydantic checks a Literal.

    Raises:
        ParamsError: one line per unknown item, ``params.yaml: export.forms[<i>]: Input should be 'onnx-fp32', ...
            or 'openvino-int8' (got 'onnx')``.
    """
    names = [repr(name) for name in FORMS]
    expected = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)
    unknown = [f"params.yaml: export.forms[{i}]: Input should be {expected} (got {form!r})"
               for i, form in enumerate(forms) if form not in FORMS]
    if unknown:
        raise ParamsError("\n".join(unknown))


def unmet(name: str) -> tuple[Need, str] | None:
    """The first unmet need of form ``name`` or its bases, with why; None when all are met."""
    form = FORMS[name]
    for need in form.needs:
        if why := need.check():
            return need, why
    return unmet(form.base) if form.base is not None else None


def _known(form: str) -> None:
    if form != PYTORCH and form not in FORMS:
        raise ExportError(f"unknown form {form!r}: one of {[PYTORCH, *FORMS]}")


def form_folder(form: str, model_dir: Path, exported_dir: Path) -> Path:
    """``model_dir`` for ``pytorch``, else ``exported_dir / form``, checked to exist without loading it.

    Raises:
        ExportError: a form the registry lacks, or a missing folder (the message says how to make it).
    """
    _known(form)
    if form == PYTORCH:
        return model_dir
    if not exported_dir.is_dir():
        raise ExportError(f"{exported_dir}: no such folder of exported forms; make it with dvc repro export (or "
                          "dvc pull), or name another one (--exported)")
    folder = exported_dir / form
    if not folder.is_dir():
        raise ExportError(f"{folder}: not found; add {form} to export.forms in params.yaml and run dvc repro export "
                          "(torch-bf16 is skipped where the hardware has no bf16: metrics/export.json says why)")
    return folder


def open_form(folder: str | Path, form: str = PYTORCH, *, load_options: dict | None = None,
              **options) -> Predictor:
    """``Predictor.open`` of ``folder`` holding ``form`` (``pytorch``: a fine-tuned model, fp32) with its loader;
    ``load_options`` go to a served form's loader (``OpenVinoClassifier``'s ``performance_hint``), ``options`` to
    ``Predictor.open``.

    Raises:
        ExportError: an unknown form, or its runtime is not installed or its file is missing.
        CheckpointError, ParamsError: as ``Predictor.open``.
    """
    _known(form)
    load = None if form == PYTORCH else functools.partial(FORMS[form].load, **(load_options or {}))
    return Predictor.open(folder, load=load, form=form, **options)


def load_form(form: str, folder: Path) -> torch.nn.Module:
    """The classifier of ``form`` in its ``folder``, in eval mode, without a Predictor (a reference server's own
    loop).

    Raises:
        ExportError: an unknown form, or its runtime is not installed or its file is missing.
        CheckpointError: a PyTorch folder lacks config, weights or tokenizer.
    """
    _known(form)
    return (load_finetuned if form == PYTORCH else FORMS[form].load)(folder).eval()
