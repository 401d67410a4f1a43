"""Serving benchmark, side by side in one run: what a user would write (``pipeline("text-classification")``, fp32)
against each served form of the export stage (finetune/export/make.py), on GLUE MRPC validation pairs.

Per model and way: batch 1 latency (p50 and p95 over the first ``--latency-pairs`` pairs, tokenizing included, in
milliseconds) and batch 32 throughput (pairs/s over all 408 pairs, tokenizing included), with validation accuracy
and F1 where the model is fine-tuned, and each way's ratio to ``pipeline()``. ``pipeline()`` takes the pairs in
file order, as a user passes them; the forms go through ``finetune.inference.predictor.Predictor`` as
``tools.predict`` and ``tools.serve`` do (batches sorted by length, so padding stays small), shown separately as
``pytorch fp32 (sorted)`` so that the sorting's share is visible.

Per model, ``best at parity`` marks the fastest served way whose accuracy and F1 are within 0.3 points of PyTorch
fp32 (an untrained head: whose predictions agree on at least 99 % of the pairs), at batch 1 and at batch 32.

The machine's matmul ceilings (fp32 and, where the instructions exist, bf16 in torch; int8 in ONNX Runtime's
``MatMulInteger``) are probed, and each way's achieved GFLOP/s at batch 32 reported as a fraction of its ceiling.

    python -m benchmarks.serve                    # the default model: models/finetuned and models/exported
    python -m benchmarks.serve --base models/kept/mpnet-mrpc   # and a base-size model fine-tuned on MRPC
    python -m benchmarks.serve --base sentence-transformers/all-mpnet-base-v2   # or, speed only, not fine-tuned

``--base`` is exported with the same ``export`` params in a temp folder and timed the same way. A fine-tuned model
folder (one with ``task.json``: a run's ``models/finetuned``, kept in models/kept; docs/serving.md says how to make
one) is scored like the default; a pretrained checkpoint gets a fresh head, so only the agreement of each form with
its own PyTorch fp32 predictions is reported. Needs ``dvc repro`` (through the export stage) on MRPC. Writes
benchmarks/serve.json and benchmarks/SERVE.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from datasets import DatasetDict, load_from_disk
from sklearn.metrics import accuracy_score, f1_score
from transformers import AutoTokenizer, pipeline

from benchmarks.machine import int8_gops, machine, matmul_gflops
from benchmarks.workspace import check_workspace
from finetune.data.sources import resolve_checkpoint
from finetune.data.tokenization import tokenize
from finetune.export.forms import make_forms
from finetune.export.make import bf16_unsupported
from finetune.export.registry import FORMS, NATIVE_BF16, form_folder, open_form, unmet
from finetune.inference.predictor import PYTORCH, Predictor
from finetune.modeling import load_classifier
from finetune.params import load_params
from finetune.paths import Paths, project_path
from finetune.runtime import markdown_table
from finetune.tasks import TASK_FILE, Task, glue_task

HERE = Path(__file__).parent


def timed(predictor: Predictor, pairs: list[tuple[str, str]], batch_size: int) -> tuple[torch.Tensor, list[float]]:
    """Logits ``[pairs, num_labels]`` in the pairs' order and the seconds of each call, tokenizing included: at batch
    1, one call per pair; else one ``predictor.logits`` call over all pairs, sorted by length in batches."""
    seconds, logits = [], []
    for chunk in ([[pair] for pair in pairs] if batch_size == 1 else [pairs]):
        begin = time.perf_counter()
        logits.append(predictor.logits(chunk, batch_size=batch_size))
        seconds.append(time.perf_counter() - begin)
    return torch.cat(logits), seconds


def pipeline_way(model_dir: Path, pairs, batch_size: int):
    """``pipeline("text-classification")`` as a user writes it; its class ids and each call's seconds."""
    classify = pipeline("text-classification", model=str(model_dir), device=-1)
    label2id = classify.model.config.label2id
    inputs = [{"text": a, "text_pair": b} for a, b in pairs]
    classify(inputs[:2], batch_size=batch_size)  # warm-up
    if batch_size == 1:
        seconds, labels = [], []
        for row in inputs:
            begin = time.perf_counter()
            labels.append(classify(row)["label"])
            seconds.append(time.perf_counter() - begin)
    else:
        begin = time.perf_counter()
        labels = [out["label"] for out in classify(inputs, batch_size=batch_size)]
        seconds = [time.perf_counter() - begin]
    return np.array([label2id[label] for label in labels]), seconds


def measure(way: str, model_dir: Path, exported: Path, pairs, latency_pairs: int) -> dict:
    """Batch 1 p50/p95 ms and batch 32 pairs/s of one way, with its batch-32 predicted class ids."""
    if way == "pipeline() fp32":
        _, lat = pipeline_way(model_dir, pairs[:latency_pairs], 1)
        predicted, sec = pipeline_way(model_dir, pairs, 32)
    else:
        form, autocast = {"pytorch fp32 (sorted)": (PYTORCH, False),
                          "torch bf16 autocast": (PYTORCH, True)}.get(way, (way, False))
        predictor = open_form(form_folder(form, model_dir, exported), form)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            timed(predictor, pairs[:4], 2)  # warm-up
            _, lat = timed(predictor, pairs[:latency_pairs], 1)
            logits, sec = timed(predictor, pairs, 32)
        predicted = logits.argmax(-1).numpy()
    return {"way": way, "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 1),
            "p95_ms": round(float(np.percentile(lat, 95)) * 1e3, 1),
            "batch32_pairs_per_s": round(len(pairs) / sum(sec), 1), "predicted": predicted}


def fine_tuned(checkpoint: str) -> bool:
    """Whether ``checkpoint`` is a fine-tuned model folder (it has the ``task.json`` the train stage saves).

    Raises:
        SystemExit: it is fine-tuned on another task than MRPC (the benchmark scores MRPC validation pairs).
    """
    folder = project_path(checkpoint)
    if not (folder / TASK_FILE).is_file():
        return False
    if (task := Task.load(folder)).name != "mrpc":
        raise SystemExit(f"ERROR: python -m benchmarks.serve: --base {checkpoint} is fine-tuned on {task.name!r}; the "
                         "benchmark scores MRPC validation pairs: give a model fine-tuned on MRPC, or a checkpoint")
    return True


def export_base(checkpoint: str, folder: Path) -> Path:
    """``checkpoint`` saved to ``folder`` with its tokenizer, and its served forms (``export.forms``) in
    ``folder / "exported"``, made as the export stage makes them (OpenVINO int8 calibrated on MRPC train rows of
    data/raw, tokenized with the checkpoint's tokenizer). A fine-tuned folder keeps its head; a pretrained
    checkpoint gets a fresh MRPC head (seed 0)."""
    torch.manual_seed(0)
    source, p, tuned = resolve_checkpoint(checkpoint).path, load_params().export, fine_tuned(checkpoint)
    if tuned:
        opened = Predictor.open(source)
        task, model, tokenizer = opened.task, opened.model, opened.tokenizer
    else:
        task, tokenizer = glue_task("mrpc"), AutoTokenizer.from_pretrained(source)
        model = load_classifier(source, task).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    task.save(folder)
    raw = load_from_disk(str(Paths().raw))["train"]
    train = tokenize(DatasetDict({"train": raw.select(range(min(len(raw), 2 * p.openvino.calibration_rows)))}),
                     tokenizer, tokenizer.model_max_length, task.text_columns)["train"]
    make_forms(model, tokenizer, folder, folder / "exported", p, train)
    return folder


def flops_per_pair(model_dir: Path, pairs) -> float:
    """The useful FLOPs of one pair: 2 x the weights of the model's linear layers x its mean real tokens (padding
    excluded; attention's own products, about 2 x seq_len x hidden per token and layer, left out)."""
    predictor = Predictor.open(model_dir)
    weights = sum(m.weight.numel() for m in predictor.model.modules() if isinstance(m, torch.nn.Linear))
    tokens = np.mean([len(ids) for ids in predictor.encode(pairs)["input_ids"]])
    return 2 * weights * float(tokens)


def bench_model(name: str, model_dir: Path, exported: Path, pairs, labels, latency_pairs: int, tuned: bool,
                ceilings: dict) -> list:
    """Every way for one model: rows with ratios to ``pipeline()``, the share of the matmul ceiling reached at batch
    32 (int8 for onnx-int8, bf16 for the bf16 ways, else fp32), and (fine-tuned) accuracy and F1, else the agreement
    with the PyTorch fp32 predictions."""
    flops = flops_per_pair(model_dir, pairs)
    forms = [form for form in FORMS if unmet(form) is None and (exported / form).is_dir()]  # made, and run here
    autocast = ["torch bf16 autocast"] if bf16_unsupported() is None else []
    ways = ["pipeline() fp32", "pytorch fp32 (sorted)", *autocast,
            *sorted(forms, key=lambda form: NATIVE_BF16 in FORMS[form].needs)]  # the bf16 forms last
    rows = []
    for way in ways:
        print(f"{name}: {way}", flush=True)
        row = measure(way, model_dir, exported, pairs, latency_pairs)
        predicted = row.pop("predicted")
        if tuned:
            row.update(accuracy=round(accuracy_score(labels, predicted), 4), f1=round(f1_score(labels, predicted), 4))
        else:
            row["agreement"] = round(float((predicted == rows[0]["_predicted"]).mean()), 4) if rows else 1.0
        row["_predicted"] = predicted
        rows.append({"model": name, **row})
    base = rows[0]
    for row in rows:
        row["x_batch1"] = round(base["p50_ms"] / row["p50_ms"], 2)
        row["x_batch32"] = round(row["batch32_pairs_per_s"] / base["batch32_pairs_per_s"], 2)
        row.pop("_predicted")
        ceiling = ceilings["int8_gops"] if "int8" in row["way"] else (
            ceilings["bf16_gflops"] if "bf16" in row["way"] else ceilings["fp32_gflops"])
        row["share_of_ceiling"] = round(row["batch32_pairs_per_s"] * flops / 1e9 / ceiling, 3)
    mark_best(rows, tuned)
    return rows


PARITY_POINTS = 0.003  # a form at parity: accuracy and F1 within 0.3 points of PyTorch fp32
PARITY_AGREEMENT = 0.99  # with an untrained head (no meaningful accuracy): at least this share of equal predictions


def at_parity(row: dict, reference: dict, tuned: bool) -> bool:
    """Whether a way's predictions match PyTorch fp32's (``reference``, the first row): by accuracy and F1 within
    ``PARITY_POINTS`` for a fine-tuned model, else by ``PARITY_AGREEMENT``."""
    if tuned:
        return all(abs(row[k] - reference[k]) <= PARITY_POINTS for k in ("accuracy", "f1"))
    return row["agreement"] >= PARITY_AGREEMENT


def mark_best(rows: list[dict], tuned: bool) -> None:
    """Set ``best`` on the fastest way at parity (``at_parity``) at batch 1 (lowest p50) and at batch 32 (most
    pairs/s), among the served ways (not ``pipeline()`` itself)."""
    candidates = [r for r in rows[1:] if at_parity(r, rows[0], tuned)]
    for row in rows:
        row["best"] = []
    if candidates:
        min(candidates, key=lambda r: r["p50_ms"])["best"].append("batch 1")
        max(candidates, key=lambda r: r["batch32_pairs_per_s"])["best"].append("batch 32")


def report(rows: list[dict], ceilings: dict, info: dict, command: str) -> str:
    header = ["model", "way", "p50 ms (batch 1)", "p95 ms", "× pipeline (batch 1)", "pairs/s (batch 32)",
              "× pipeline (batch 32)", "share of matmul ceiling", "validation accuracy / F1 (agreement)",
              "best at parity"]
    table = markdown_table(header, [[r["model"], r["way"], r["p50_ms"], r["p95_ms"], r["x_batch1"],
                                     r["batch32_pairs_per_s"], r["x_batch32"], r["share_of_ceiling"],
                                     f"{r['accuracy']} / {r['f1']}" if "accuracy" in r else f"({r['agreement']})",
                                     ", ".join(r["best"])] for r in rows])
    bf16 = ceilings["bf16_gflops"]
    return (f"# Serving benchmark\n\n`{command}` on {date.today()}: {info['cpu']}, {info['cores']} threads, torch "
            f"{info['torch']}, onnxruntime {ceilings['onnxruntime']}; MRPC validation (408 pairs).\n\n{table}\n"
            f"Matmul ceilings (2048², best of 10): fp32 {ceilings['fp32_gflops']:.0f} GFLOP/s (torch), int8 "
            f"{ceilings['int8_gops']:.0f} GOP/s (ONNX Runtime MatMulInteger), bf16 "
            f"{f'{bf16:.0f} GFLOP/s' if bf16 else 'not probed (' + str(bf16_unsupported()) + ')'}.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", metavar="CHECKPOINT", help="also a base-size model: a fine-tuned folder, e.g. "
                        "models/kept/mpnet-mrpc, or a checkpoint, e.g. sentence-transformers/all-mpnet-base-v2 "
                        "(exported here with a fresh head)")
    parser.add_argument("--latency-pairs", type=int, default=100, help="pairs timed one by one (batch 1)")
    parser.add_argument("--out-dir", type=Path, default=HERE)
    parser.add_argument("--export-to", type=Path, help=argparse.SUPPRESS)  # internal: export --base there, exit
    args = parser.parse_args()
    if args.export_to:
        export_base(args.base, args.export_to)
        return
    if problem := check_workspace():
        raise SystemExit(f"ERROR: python -m benchmarks.serve: {problem}")
    base_tuned = fine_tuned(args.base) if args.base else False  # refuses another task's model before any timing
    paths = Paths()
    raw = load_from_disk(str(paths.raw))["validation"]
    pairs, labels = list(zip(raw["sentence1"], raw["sentence2"])), np.array(raw["label"])
    ceilings = {"fp32_gflops": matmul_gflops(torch.float32), "int8_gops": int8_gops(),
                "bf16_gflops": matmul_gflops(torch.bfloat16) if bf16_unsupported() is None else None,
                "onnxruntime": onnxruntime.__version__}
    rows = bench_model("default (fine-tuned)", paths.finetuned, paths.exported, pairs, labels, args.latency_pairs,
                       tuned=True, ceilings=ceilings)
    if args.base:
        with tempfile.TemporaryDirectory() as tmp:
            # In its own process: after torch.export ran in this one, eager PyTorch ran 3x slower at batch 1.
            folder = Path(tmp)
            subprocess.run([sys.executable, "-m", "benchmarks.serve", "--base", args.base, "--export-to", tmp],
                           check=True)
            rows += bench_model(args.base.split("/")[-1], folder, folder / "exported", pairs, labels,
                                args.latency_pairs, tuned=base_tuned, ceilings=ceilings)
    info = machine()
    command = "python -m benchmarks.serve" + (f" --base {args.base}" if args.base else "")
    (args.out_dir / "serve.json").write_text(json.dumps({"machine": info, "ceilings": ceilings, "rows": rows},
                                                        indent=2) + "\n")
    (args.out_dir / "SERVE.md").write_text(report(rows, ceilings, info, command))
    print(report(rows, ceilings, info, command))


if __name__ == "__main__":
    main()
