"""The export stage's served forms (finetune/export/: registry, make, openvino, forms, parity, speed; their runtimes in
finetune/inference/runtimes.py)
with tiny random models: each family exports and its ONNX fp32 logits equal PyTorch's, int8 quantizes (keeping the
named modules fp32), the stage writes export.json and every form folder atomically, a corrupted export fails the stage
naming the form, ``tools.predict --form`` gives the PyTorch form's predictions, bad input stops with one line, and a
form registered at run time is validated, made, checked and served like the built-in ones."""

from __future__ import annotations

import re
import shutil
import sys

import onnx
import pytest
import torch
from datasets import load_from_disk
from transformers import AutoTokenizer

from finetune.errors import ExportError, ParamsError
from finetune.export import make as export
from finetune.export.forms import export_forms
from finetune.export.make import encoder_type, export_onnx, module_of, quantize_int8
from finetune.export.registry import FORMS, Form, Need, check_forms, form_folder, load_form, open_form, register
from finetune.inference.runtimes import OnnxClassifier
from finetune.modeling import load_classifier, load_finetuned
from finetune.paths import Paths
from finetune.tasks import glue_task
from tests.helpers import FAMILIES, REPO, make_family_checkpoint, make_project, tiny_params

MRPC = glue_task("mrpc")
PAIRS = (["The company reported higher profits.", "Police said the man was arrested on Tuesday after a long chase."],
         ["Profits rose.", "The man was arrested."])


def save_model(checkpoint, folder, pooling="cls"):
    """A tiny MRPC classifier (fresh head, seed 0) of ``checkpoint`` saved with its tokenizer and task.json."""
    torch.manual_seed(0)
    model = load_classifier(checkpoint, MRPC, pooling).eval()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(folder)
    MRPC.save(folder)
    return model


# The attention projections of each family as its modeling_<family>.py names them (int8 keeps them fp32): query, key
# and value, or one fused module.
QKV = {"bert": ["query", "key", "value"], "roberta": ["query", "key", "value"], "electra": ["query", "key", "value"],
       "distilbert": ["q_lin", "k_lin", "v_lin"], "deberta-v2": ["query_proj", "key_proj", "value_proj"],
       "mpnet": ["q", "k", "v"], "modernbert": ["Wqkv"], "eurobert": ["q_proj", "k_proj", "v_proj"],
       "gte": ["q_proj", "k_proj", "v_proj"], "nomic_bert": ["q_proj", "k_proj", "v_proj"],
       "jina_embeddings_v3": ["q_proj", "k_proj", "v_proj"]}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_exports_with_pytorch_logits_and_quantizes(family, tmp_path):
    # one layer (the export's time grows with the graph); ModernBERT two, a full and a sliding-window attention layer
    layers = 2 if family == "modernbert" else 1
    checkpoint = make_family_checkpoint(tmp_path / "checkpoint", family, layers=layers)
    # the mean-pooling head exports too. ModernBERT's cls head (dense, GELU, LayerNorm) on random weights scales int8's
    # error beyond this test's 0.05 (about 0.15 logits), so its mean head is checked here
    pooling = "mean" if family in ("bert", "modernbert") else "cls"
    model = save_model(checkpoint, tmp_path / "model", pooling)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    (tmp_path / "fp32").mkdir()
    shutil.copy(tmp_path / "model" / "config.json", tmp_path / "fp32")
    export_onnx(model, tokenizer, tmp_path / "fp32" / "model.onnx", opset=18)

    batch = tokenizer(*PAIRS, padding=True, return_tensors="pt")  # other lengths than the export's example
    with torch.no_grad():
        expected = model(**batch).logits
    assert torch.allclose(OnnxClassifier(tmp_path / "fp32")(**batch).logits, expected, atol=1e-4)

    (tmp_path / "int8").mkdir()
    shutil.copy(tmp_path / "model" / "config.json", tmp_path / "int8")
    kept = quantize_int8(tmp_path / "fp32" / "model.onnx", tmp_path / "int8" / "model.onnx", True,
                         ["query", "key", "value"], encoder_type(model.config))
    projections = [name for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in QKV[family]]
    assert kept == sorted(projections) and len(kept) == layers * len(QKV[family]), kept  # in each layer
    ops = {node.op_type for node in onnx.load(str(tmp_path / "int8" / "model.onnx")).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul"}, ops
    logits = OnnxClassifier(tmp_path / "int8")(**batch).logits
    assert logits.shape == expected.shape and torch.isfinite(logits).all()
    assert (logits - expected).abs().max() < 0.05  # int8 weights of a tiny random model: close, not equal


@pytest.fixture(scope="module")
def finetuned_template(tiny_raw, tiny_checkpoint, tmp_path_factory):
    """A project as the export stage finds it: data/tokenized and models/finetuned (a tiny MRPC classifier)."""
    params = tiny_params(export={"forms": ["onnx-fp32", "onnx-int8", "torch-bf16"]})
    paths = make_project(tmp_path_factory.mktemp("export") / "p", params, tiny_raw, tiny_checkpoint)
    save_model(paths.pretrained, paths.finetuned)
    (paths.finetuned / "README.md").write_text("# model card\n")
    return params, paths.root


@pytest.fixture(scope="module")
def template_onnx(finetuned_template, tmp_path_factory):
    """The ONNX fp32 export of the template's model, made once with ``export_onnx`` (torch.onnx.export: 2 to 5 s a
    call); each copy's model is the same, and the export stage's tests below copy this file instead."""
    params, template = finetuned_template
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    finetuned = Paths(template).finetuned
    export_onnx(load_finetuned(finetuned), AutoTokenizer.from_pretrained(finetuned), path, params.export.opset)
    return path


@pytest.fixture
def finetuned(finetuned_template, template_onnx, tmp_path, monkeypatch):
    """A copy of ``finetuned_template`` for one test (made once: tokenizing and saving cost seconds a test), whose
    ONNX export is ``template_onnx`` (the real export of each family: test_each_family_exports_…; of the stage, in
    a `dvc exp run`: tests/test_pipeline_e2e.py)."""
    params, template = finetuned_template
    shutil.copytree(template, tmp_path / "p")
    monkeypatch.setattr(export, "export_onnx", lambda model, tokenizer, path, opset: shutil.copy(template_onnx, path))
    return params, Paths(tmp_path / "p")


def test_module_names_of_onnx_nodes_and_no_local_paths(template_onnx):
    # template_onnx: export_onnx of a tiny BERT classifier
    modules = {module_of(n) for n in onnx.load(str(template_onnx)).graph.node if n.op_type == "MatMul"}
    assert "bert.encoder.layer.0.attention.self.query" in modules
    assert "bert.encoder.layer.1.output.dense" in modules
    # No stack traces with this checkout's paths: the same model exported in another clone is the same file.
    assert str(REPO).encode() not in template_onnx.read_bytes()


def test_int8_keeps_by_role_and_names_a_family_whose_projections_it_cannot_find(template_onnx, tmp_path):
    # template_onnx: a tiny BERT classifier
    kept = quantize_int8(template_onnx, tmp_path / "query.onnx", True, ["query"], "bert")
    assert kept == [f"bert.encoder.layer.{i}.attention.self.query" for i in (0, 1)]
    listed = (r"^export.int8.keep_fp32: model type 'mpnet' has no attention query projection named 'q' \(its family "
              r"is in ATTENTION_PROJECTIONS, finetune/export/make.py\); add its names there, or set "
              r"export.int8.keep_fp32: \[\] to make every matmul int8$")
    with pytest.raises(ExportError, match=listed):
        quantize_int8(template_onnx, tmp_path / "mpnet.onnx", True, ["query", "key", "value"], "mpnet")
    # a family not listed is read with BERT's names: here its graph names the projections as Funnel does
    graph = onnx.load(str(template_onnx))
    for node in graph.graph.node:
        for prop in node.metadata_props:
            prop.value = re.sub(r"attention\.self\.(query|key|value)\b", lambda m: f"attention.{m[1][0]}_head",
                                prop.value)
    onnx.save(graph, str(tmp_path / "funnel-like.onnx"))
    with pytest.raises(ExportError, match=r"model type 'funnel' has no attention query projection named 'query' "
                                          r"\(its family is not in ATTENTION_PROJECTIONS"):
        quantize_int8(tmp_path / "funnel-like.onnx", tmp_path / "funnel.onnx", True, ["query", "value"], "funnel")
    assert not list(tmp_path.glob("*[ln].onnx"))  # nothing written for mpnet or funnel
    assert quantize_int8(tmp_path / "funnel-like.onnx", tmp_path / "all.onnx", True, [], "funnel") == []


def test_stage_writes_every_form_and_its_parity(finetuned, monkeypatch):
    params, paths = finetuned
    monkeypatch.setattr(export, "cpu_bf16_flags", lambda: ["avx512_bf16"])  # make the bf16 form on any CPU
    results = export_forms(params, paths)

    assert list(results) == ["pytorch", "onnx-fp32", "onnx-int8", "torch-bf16", "fastest_at_parity"]
    made = ("onnx-fp32", "onnx-int8", "torch-bf16")
    for form in made:
        for split in ("validation", "test"):
            assert set(results[form][split]) == {"loss", "accuracy", "f1", "agreement", "max_abs_logit_diff"}
        assert (paths.exported / form / "tokenizer.json").exists() and (paths.exported / form / "task.json").exists()
        assert f"## This form: {form}" in (paths.exported / form / "README.md").read_text()
    fp32 = results["onnx-fp32"]
    assert fp32["validation"]["agreement"] == 1.0 and fp32["validation"]["max_abs_logit_diff"] < 1e-4
    assert fp32["validation"]["accuracy"] == results["pytorch"]["validation"]["accuracy"]
    assert results["onnx-int8"]["size_mb"] < fp32["size_mb"]
    assert results["onnx-int8"]["kept_fp32_matmuls"] == 6
    assert load_form("torch-bf16", paths.exported / "torch-bf16").dtype == torch.bfloat16
    # The forms at parity and PyTorch are timed; the fastest at each batch size is named, and on its card.
    timed = [form for form, r in results.items() if "speed" in r]
    assert "pytorch" in timed and set(timed) == {"pytorch", *(f for f in made if "warning" not in results[f])}
    assert all(results[f]["speed"]["batch_1_p50_ms"] > 0 and results[f]["speed"]["batch_32_rows_per_s"] > 0
               for f in timed)
    fastest = results["fastest_at_parity"]
    assert fastest["machine"].startswith("cpu: ") and {fastest["batch_1"], fastest["batch_32"]} <= set(timed)
    assert fastest["batch_1"] == min(timed, key=lambda f: results[f]["speed"]["batch_1_p50_ms"])
    assert fastest["batch_32"] == max(timed, key=lambda f: results[f]["speed"]["batch_32_rows_per_s"])
    for form in {fastest["batch_1"], fastest["batch_32"]} - {"pytorch"}:
        assert "**The fastest form at parity at batch" in (paths.exported / form / "README.md").read_text()
    assert sorted(p.name for p in paths.exported.parent.iterdir()) == ["exported", "finetuned", "pretrained"]


def test_int8_only_keeps_no_fp32_folder_and_bf16_is_skipped_without_hardware(finetuned, monkeypatch):
    params, paths = finetuned
    params = params.model_copy(update={"export": params.export.model_copy(update={"forms": ["onnx-int8",
                                                                                         "torch-bf16"]})})
    monkeypatch.setattr(export, "cpu_bf16_flags", lambda: [])  # a CPU without AVX512-BF16 or AMX-BF16
    results = export_forms(params, paths)
    assert results["torch-bf16"]["skipped"].startswith("this CPU has no AVX512-BF16 or AMX-BF16")
    assert sorted(p.name for p in paths.exported.iterdir()) == ["onnx-int8"]


def scaled_classifier(export_onnx, scale: float):
    """``export_onnx`` (the fixture's: template_onnx copied) with the classifier's weights times ``scale`` in the
    graph: an fp32 export whose logits are wrong."""
    def corrupted(model, tokenizer, path, opset):
        export_onnx(model, tokenizer, path, opset)
        graph = onnx.load(str(path))
        classifier = next(t for t in graph.graph.initializer if "classifier.weight" in t.name)
        values = onnx.numpy_helper.to_array(classifier) * scale
        classifier.CopyFrom(onnx.numpy_helper.from_array(values, classifier.name))
        onnx.save(graph, str(path))
        return path

    return corrupted


@pytest.mark.parametrize("scale", [1.5, float("nan")], ids=["wrong-logits", "nan-logits"])
def test_corrupted_fp32_export_fails_naming_the_form_and_keeps_the_old_folder(finetuned, monkeypatch, scale):
    params, paths = finetuned
    if scale != scale:  # NaN: onnx-fp32 alone (int8's quantizer refuses NaN weights itself)
        params = params.model_copy(update={"export": params.export.model_copy(update={"forms": ["onnx-fp32"]})})
    (paths.exported / "old").mkdir(parents=True)
    monkeypatch.setattr(export, "export_onnx", scaled_classifier(export.export_onnx, scale))
    with pytest.raises(ExportError, match=r"^onnx-fp32: validation logits differ .* export.fp32_tolerance"):
        export_forms(params, paths)
    assert [p.name for p in paths.exported.iterdir()] == ["old"]
    assert not list(paths.exported.parent.glob(".exported.*"))


def test_fp32_parity_is_checked_on_validation_when_no_evaluated_split_has_labels(finetuned, monkeypatch):
    params, paths = finetuned
    tokenized = load_from_disk(str(paths.tokenized))
    tokenized["test"] = tokenized["test"].remove_columns("labels")  # an unlabeled test split, the only one evaluated
    tokenized.save_to_disk(str(paths.root / "unlabeled"))
    shutil.rmtree(paths.tokenized)
    (paths.root / "unlabeled").rename(paths.tokenized)
    params = params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"splits": ["test"]})})
    monkeypatch.setattr(export, "export_onnx", scaled_classifier(export.export_onnx, 1.5))
    with pytest.raises(ExportError, match=r"^onnx-fp32: validation logits differ .* export.fp32_tolerance"):
        export_forms(params, paths)


def test_lossy_form_beyond_the_tolerance_is_flagged(finetuned, caplog):
    params, paths = finetuned
    settings = params.export.model_copy(update={"forms": ["onnx-int8"], "max_metric_drop": 0.0})
    results = export_forms(params.model_copy(update={"export": settings}), paths)
    pytorch, int8 = results["pytorch"]["validation"]["f1"], results["onnx-int8"]["validation"]["f1"]
    if int8 < pytorch:  # the tiny model's int8 F1 may not drop at all; when it does, it is flagged everywhere
        assert any("onnx-int8 loses" in w for w in results["onnx-int8"]["warning"])
        assert "onnx-int8 loses" in caplog.text
        assert "**Warning:** onnx-int8 loses" in (paths.exported / "onnx-int8" / "README.md").read_text()
    else:
        assert "warning" not in results["onnx-int8"]
    # only forms at parity are timed
    assert ("speed" in results["onnx-int8"]) == ("warning" not in results["onnx-int8"])


def test_predict_with_a_form_equals_pytorch(finetuned, tmp_path, monkeypatch):
    from tools.predict import predict

    params, paths = finetuned
    export_forms(params, paths)
    rows = tmp_path / "rows.csv"
    rows.write_text("sentence1,sentence2\n" + "".join(f'"{a}","{b}"\n' for a, b in zip(*PAIRS)) * 3)
    pytorch = predict(rows, paths.finetuned)
    onnx_fp32 = predict(rows, paths.finetuned, form="onnx-fp32", exported_dir=paths.exported)
    assert (onnx_fp32["prediction"] == pytorch["prediction"]).all()
    assert (onnx_fp32["probability_equivalent"] - pytorch["probability_equivalent"]).abs().max() <= 2e-5
    int8 = predict(rows, paths.finetuned, form="onnx-int8", exported_dir=paths.exported)
    agreeing = int8["prediction"] == pytorch["prediction"]
    assert agreeing.any() and list(int8.columns) == list(pytorch.columns)
    # a runtime's session asked to run on a GPU (tools.predict where torch sees one): its batches stay on the CPU
    assert open_form(paths.exported / "onnx-fp32", "onnx-fp32", device="cuda").device == torch.device("cpu")


def test_bad_forms_and_missing_onnxruntime_say_what_to_do(finetuned, monkeypatch):
    _, paths = finetuned
    with pytest.raises(ExportError, match=r"unknown form 'onnx'"):
        form_folder("onnx", paths.finetuned, paths.exported)
    with pytest.raises(ExportError, match=r"exported: no such folder of exported forms; make it with dvc repro export"):
        form_folder("onnx-int8", paths.finetuned, paths.exported)
    paths.exported.mkdir(exist_ok=True)
    with pytest.raises(ExportError, match=r"exported/onnx-int8: not found; add onnx-int8 to export.forms"):
        form_folder("onnx-int8", paths.finetuned, paths.exported)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ExportError, match=r"ONNX Runtime is not installed"):
        OnnxClassifier(paths.finetuned)


def test_export_params_are_checked():
    unknown = r"^params.yaml: export.forms\[1\]: Input should be 'onnx-fp32', .* \(got 'onnx'\)$"
    with pytest.raises(ParamsError, match=unknown):
        check_forms(["onnx-int8", "onnx"])
    with pytest.raises(ParamsError, match=r"export.forms: 'onnx-int8' is listed twice; list each once"):
        tiny_params(export={"forms": ["onnx-int8", "onnx-int8"]})
    with pytest.raises(ParamsError, match=r"export.opset"):
        tiny_params(export={"opset": 9})
    # keep_fp32 names roles; each family's module names are the code's (ATTENTION_PROJECTIONS)
    with pytest.raises(ParamsError, match=r"export.int8.keep_fp32\[0\]: Input should be 'query', 'key' or 'value' "
                                          r"\(got 'q_lin'\)$"):
        tiny_params(export={"int8": {"per_channel": True, "keep_fp32": ["q_lin"]}})
    with pytest.raises(ParamsError, match=r"export.int8.keep_fp32: 'key' is listed twice; list each once$"):
        tiny_params(export={"int8": {"per_channel": True, "keep_fp32": ["key", "key"]}})


def test_exporter_failure_names_the_model_type(tiny_checkpoint, tmp_path, monkeypatch):
    model = save_model(tiny_checkpoint, tmp_path / "model")

    def fails(*args, **kwargs):
        raise RuntimeError("unsupported operator aten::something\nmore")

    monkeypatch.setattr(torch.onnx, "export", fails)
    with pytest.raises(ExportError, match=r"can't export model type 'bert': RuntimeError: unsupported operator"):
        export_onnx(model, AutoTokenizer.from_pretrained(tiny_checkpoint), tmp_path / "m.onnx", 18)


def test_openvino_failure_names_the_file_in_one_line(template_onnx, tmp_path, monkeypatch):
    import openvino

    from finetune.export.openvino import save_openvino

    def fails(*args, **kwargs):
        raise RuntimeError("Check 'error' failed at src/frontends/onnx: unsupported operator\nmore")

    monkeypatch.setattr(openvino, "convert_model", fails)
    message = (r"^export.forms openvino-fp32: openvino.convert_model can't convert .*model.onnx: RuntimeError: Check "
               r"'error' failed at src/frontends/onnx: unsupported operator; remove the OpenVINO forms from "
               r"export.forms for this model$")
    with pytest.raises(ExportError, match=message):
        save_openvino(template_onnx, tmp_path / "openvino-fp32")


OPENVINO = ["openvino-fp32", "openvino-bf16", "openvino-int8"]


def test_openvino_forms_agree_with_pytorch_and_calibrate_on_train_rows_only(finetuned, tmp_path, monkeypatch):
    import nncf

    from finetune.export import openvino as openvino_forms
    from tools.predict import predict

    params, paths = finetuned
    settings = params.export.model_copy(update={"forms": OPENVINO,
                                                "openvino": params.export.openvino.model_copy(
                                                    update={"calibration_rows": 25})})
    monkeypatch.setattr(export, "cpu_bf16_flags", lambda: ["avx512_bf16"])  # make the bf16 form on any CPU
    calibrated, quantize = [], nncf.quantize

    def recording(model, dataset, **kwargs):
        calibrated.extend(dataset.get_inference_data())
        return quantize(model, dataset, **kwargs)

    monkeypatch.setattr(nncf, "quantize", recording)
    results = export_forms(params.model_copy(update={"export": settings}), paths)

    assert list(results) == ["pytorch", *OPENVINO, "fastest_at_parity"]
    assert not (paths.exported / "onnx-fp32").exists()  # the ONNX file they start from is not a form asked for
    fp32 = results["openvino-fp32"]["validation"]
    assert fp32["agreement"] == 1.0 and fp32["max_abs_logit_diff"] < params.export.fp32_tolerance
    for form in OPENVINO:
        assert (paths.exported / form / "openvino_model.xml").is_file(), form
        assert f"## This form: {form}" in (paths.exported / form / "README.md").read_text()
    assert results["openvino-int8"]["calibration_rows"] == 25 and results["openvino-int8"]["calibration_seed"] == 42
    # the calibration rows: 25 of the 40 train rows, never a validation or test row
    tokenized = load_from_disk(str(paths.tokenized))
    train_rows = {tuple(ids) for ids in tokenized["train"]["input_ids"]}
    held_out = {tuple(ids) for split in ("validation", "test") for ids in tokenized[split]["input_ids"]} - train_rows
    seen = [tuple(sample["input_ids"][0]) for sample in calibrated]
    assert len(seen) == 25 and set(seen) <= train_rows and not set(seen) & held_out
    # tools.predict --form: the same table as the PyTorch form; openvino-fp32 predicts as PyTorch does
    rows = tmp_path / "rows.csv"
    rows.write_text("sentence1,sentence2\n" + "".join(f'"{a}","{b}"\n' for a, b in zip(*PAIRS)))
    pytorch = predict(rows, paths.finetuned)
    for form in OPENVINO:
        served = predict(rows, paths.finetuned, form=form, exported_dir=paths.exported)
        assert list(served.columns) == list(pytorch.columns), form
        agreeing = served["prediction"] == pytorch["prediction"]
        assert agreeing.any(), form
        if form == "openvino-fp32":
            assert agreeing.all()
            assert (served["probability_equivalent"] - pytorch["probability_equivalent"]).abs().max() <= 2e-5
    hinted = open_form(paths.exported / "openvino-fp32", "openvino-fp32",  # tools.serve --openvino-hint THROUGHPUT
                       load_options={"performance_hint": "THROUGHPUT"})
    assert str(hinted.model.compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"
    assert openvino_forms.openvino_missing() is None


def test_missing_openvino_is_named_and_the_other_forms_are_made(finetuned, monkeypatch, caplog):
    from finetune.export import openvino as openvino_forms

    params, paths = finetuned
    real = openvino_forms.importlib.util.find_spec
    monkeypatch.setattr(openvino_forms.importlib.util, "find_spec",
                        lambda name, *a: None if name == "openvino" else real(name, *a))
    settings = params.export.model_copy(update={"forms": ["onnx-int8", "openvino-int8"]})
    results = export_forms(params.model_copy(update={"export": settings}), paths)
    why = results["openvino-int8"]["skipped"]
    assert why == "openvino not installed: pip install -e '.[serve]' (or bash .ci/setup: the lock has it)"
    assert f"openvino-int8: skipped: {why}" in caplog.text and "Traceback" not in caplog.text
    assert sorted(p.name for p in paths.exported.iterdir()) == ["onnx-int8"]
    (paths.exported / "openvino-int8").mkdir()  # a folder, so that loading the form gets to importing OpenVINO
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(ExportError, match=r"OpenVINO is not installed: pip install -e '.\[serve\]'"):
        load_form("openvino-int8", paths.exported / "openvino-int8")


def test_the_registry_refuses_a_name_twice_and_an_unknown_base():
    assert all(form.base is None or form.base in FORMS for form in FORMS.values())
    with pytest.raises(ValueError, match="'onnx-int8' is already registered"):
        register(FORMS["onnx-int8"])
    with pytest.raises(ValueError, match="its base 'onnx-fp16' is not a registered form"):
        register(Form("x", make_torch_fp32, load_finetuned, lossy=False, loaded_with="-", base="onnx-fp16"))


# A new form is one module (here, these functions) and one registry entry (here, registered at run time).
def make_torch_fp32(job):
    """The PyTorch model's fp32 weights as a pickled state dict (pytorch_model.bin) beside the side files."""
    torch.save(job.model.state_dict(), job.folder / "pytorch_model.bin")
    return {"weights": "pytorch_model.bin"}


def copy_onnx(job):
    """The base form's ONNX file, as it is."""
    shutil.copy(job.base / "model.onnx", job.folder / "model.onnx")
    return {}


def no_such_package():
    return "no_such_package not installed"


@pytest.fixture
def registered():
    """``finetune.export.registry.register``, with the registry as it was after the test."""
    before = dict(FORMS)
    yield register
    FORMS.clear()
    FORMS.update(before)


def test_a_registered_form_is_validated_made_checked_and_predicts(finetuned, registered, tmp_path, caplog):
    from tools.predict import predict

    _, paths = finetuned
    forms = ["torch-fp32", "onnx-copy", "needs-a-package"]
    unknown = r"export.forms\[0\]: Input should be .* or 'openvino-int8' \(got 'torch-fp32'\)"
    params = tiny_params(export={"forms": forms})
    with pytest.raises(ParamsError, match=unknown):  # the export stage checks the names
        export_forms(params, paths)
    registered(Form("torch-fp32", make_torch_fp32, load_finetuned, lossy=False,
                    loaded_with="AutoModelForSequenceClassification.from_pretrained(folder)"))
    registered(Form("onnx-copy", copy_onnx, OnnxClassifier, lossy=False,
                    loaded_with="onnxruntime.InferenceSession(\"model.onnx\")", base="onnx-fp32"))
    registered(Form("needs-a-package", copy_onnx, OnnxClassifier, lossy=False, loaded_with="-",
                    needs=(Need("package", no_such_package),), base="onnx-fp32"))

    results = export_forms(params, paths)
    assert list(results) == ["pytorch", *forms, "fastest_at_parity"]
    assert results["needs-a-package"] == {"skipped": "no_such_package not installed"}
    assert "needs-a-package: skipped: no_such_package not installed" in caplog.text
    assert results["torch-fp32"]["weights"] == "pytorch_model.bin"
    for form in ("torch-fp32", "onnx-copy"):  # checked against PyTorch as an fp32 form, and timed at parity
        for split in ("validation", "test"):
            assert results[form][split]["agreement"] == 1.0
            assert results[form][split]["max_abs_logit_diff"] <= params.export.fp32_tolerance
        assert results[form]["size_mb"] > 0 and "speed" in results[form]
        assert "## This form: " + form in (paths.exported / form / "README.md").read_text()
    assert "from_pretrained(folder)`" in (paths.exported / "torch-fp32" / "README.md").read_text()
    assert sorted(p.name for p in paths.exported.iterdir()) == ["onnx-copy", "torch-fp32"]  # not its base

    rows = tmp_path / "rows.csv"
    rows.write_text("sentence1,sentence2\n" + "".join(f'"{a}","{b}"\n' for a, b in zip(*PAIRS)))
    pytorch = predict(rows, paths.finetuned)
    for form in ("torch-fp32", "onnx-copy"):
        served = predict(rows, paths.finetuned, form=form, exported_dir=paths.exported)
        assert (served["prediction"] == pytorch["prediction"]).all(), form
        assert (served["probability_equivalent"] - pytorch["probability_equivalent"]).abs().max() <= 2e-5, form


def make_off(job):
    """A wrong fp32 form: the PyTorch weights with the classifier's scaled by 1.5."""
    weights = {name: t * 1.5 if "classifier" in name else t for name, t in job.model.state_dict().items()}
    torch.save(weights, job.folder / "pytorch_model.bin")
    return {}


def test_a_registered_fp32_form_off_pytorch_fails_the_stage(finetuned, registered):
    _, paths = finetuned
    registered(Form("torch-off", make_off, load_finetuned, lossy=False, loaded_with="-"))
    with pytest.raises(ExportError, match=r"^torch-off: validation logits differ .* export.fp32_tolerance"):
        export_forms(tiny_params(export={"forms": ["torch-off"]}), paths)


def test_served_form_is_the_export_stages_choice_or_one_line(tmp_path):
    from finetune.export.speed import served_form

    metrics = tmp_path / "export.json"
    for content, message in [(None, "not found, so no fastest form to serve"),
                             ("<<<<<<< HEAD\n", "not JSON (JSONDecodeError: "), ("[]", "no fastest_at_parity.batch_32"),
                             ('{"fastest_at_parity": {"batch_32": "onnx-int4"}}',
                              "fastest_at_parity.batch_32 names 'onnx-int4', not a form of this code")]:
        if content is not None:
            metrics.write_text(content)
        with pytest.raises(ExportError) as err:
            served_form(metrics)
        assert str(err.value).startswith(f"{metrics}: {message}") and "\n" not in str(err.value), err.value
    metrics.write_text('{"fastest_at_parity": {"batch_32": "onnx-int8"}}')
    assert served_form(metrics) == "onnx-int8"
