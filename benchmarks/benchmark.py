"""Side-by-side benchmark: the course's loop, transformers.Trainer and this project's train stage.

Each way tokenizes data/raw, trains the same checkpoint (models/pretrained) with the same epochs, batch size
and learning rate, and evaluates on validation, in its own subprocess (so peak RSS is its own). Reported per
way: train samples/s, wall seconds (tokenize + train + evaluate), peak RSS, validation accuracy and F1, and
the ratio of each to the course loop. The machine's dense matmul ceiling (fp32, bf16 GFLOP/s) is measured too,
and the project's training FLOP/s is reported as a fraction of it.

    python -m benchmarks.benchmark --mode short   # 40 optimizer steps per way, a few minutes
    python -m benchmarks.benchmark --mode full    # whole runs (3 epochs each)
    python -m benchmarks.benchmark --checkpoints sentence-transformers/all-MiniLM-L6-v2 \\
        sentence-transformers/all-mpnet-base-v2   # the project's stages on each checkpoint, same settings

The project's way calls the stages themselves (tokenize, train, evaluate on validation) in a temporary project
whose params are params.yaml with the benchmark's overrides, validated like params.yaml.
Needs data/raw and models/pretrained of GLUE MRPC (`dvc repro download` with params.yaml's data section as
committed); in a workspace whose params.yaml or data/raw hold another task it stops with one line saying what to
restore. Writes benchmarks/results.json and benchmarks/RESULTS.md (full mode) or benchmarks/results-short.json and
RESULTS-short.md (short mode); ``--checkpoints`` writes benchmarks/CHECKPOINTS.md and checkpoints.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from finetune.hardware import cpu_bf16_flags, cpu_model, resolve_mixed_precision
from finetune.params import load_params, with_overrides
from finetune.paths import Paths
from finetune.runtime import peak_memory_mb
from finetune.tables import markdown_table

HERE = Path(__file__).parent
RAW_DIR, PRETRAINED_DIR = Paths().raw, Paths().pretrained
WAYS = ["course_loop", "trainer", "project"]
SHORT_STEPS = 40


# ---------------------------------------------------------------- the three ways (each runs in a subprocess)

def course_loop(max_steps: int | None) -> dict:
    """The loop of the course chapter "A full training", as written: random batches, fp32, batch 8, lr 5e-5."""
    import evaluate  # noqa: F401  (imported as the course does; the metric module is the project's local one)
    from datasets import load_from_disk
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, get_scheduler

    from finetune.evaluation import load_metric
    from finetune.tasks import glue_task

    start = time.perf_counter()
    raw_datasets = load_from_disk(str(RAW_DIR))
    tokenizer = AutoTokenizer.from_pretrained(PRETRAINED_DIR)

    def tokenize_function(example):
        return tokenizer(example["sentence1"], example["sentence2"], truncation=True)

    tokenized_datasets = raw_datasets.map(tokenize_function, batched=True, keep_in_memory=True)
    data_collator = DataCollatorWithPadding(tokenizer=tokenizer)
    tokenized_datasets = tokenized_datasets.remove_columns(["sentence1", "sentence2", "idx"])
    tokenized_datasets = tokenized_datasets.rename_column("label", "labels")
    tokenized_datasets.set_format("torch")
    train_dataloader = DataLoader(tokenized_datasets["train"], shuffle=True, batch_size=8, collate_fn=data_collator)
    eval_dataloader = DataLoader(tokenized_datasets["validation"], batch_size=8, collate_fn=data_collator)

    torch.manual_seed(42)
    model = AutoModelForSequenceClassification.from_pretrained(PRETRAINED_DIR, num_labels=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    num_epochs = 3
    num_training_steps = max_steps or num_epochs * len(train_dataloader)
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=num_training_steps)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    model.to(device)

    progress_bar = tqdm(range(num_training_steps))
    train_start, samples, tokens, padded, step = time.perf_counter(), 0, 0, 0, 0
    model.train()
    while step < num_training_steps:
        for batch in train_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            progress_bar.update(1)
            samples, step = samples + len(batch["labels"]), step + 1
            tokens, padded = tokens + int(batch["attention_mask"].sum()), padded + batch["attention_mask"].numel()
            if step == num_training_steps:
                break
    _sync()
    train_seconds = time.perf_counter() - train_start

    metric = load_metric(glue_task("mrpc"))
    model.eval()
    for batch in eval_dataloader:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.no_grad():
            outputs = model(**batch)
        predictions = torch.argmax(outputs.logits, dim=-1)
        metric.add_batch(predictions=predictions, references=batch["labels"])
    result = metric.compute()
    return {"samples": samples, "real_tokens": tokens, "steps": step, "train_seconds": train_seconds,
            "padding_fraction": 1 - tokens / padded, "wall_s": time.perf_counter() - start, **result}


def trainer(max_steps: int | None) -> dict:
    """transformers.Trainer with the course's settings: batch 8, lr 5e-5, linear, no warmup, 3 epochs, fp32."""
    from datasets import load_from_disk
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              TrainingArguments)

    from finetune.evaluation import load_metric
    from finetune.tasks import glue_task

    start = time.perf_counter()
    raw = load_from_disk(str(RAW_DIR))
    tokenizer = AutoTokenizer.from_pretrained(PRETRAINED_DIR)
    tokenized = raw.map(lambda b: tokenizer(b["sentence1"], b["sentence2"], truncation=True), batched=True,
                        keep_in_memory=True)
    model = AutoModelForSequenceClassification.from_pretrained(PRETRAINED_DIR, num_labels=2)
    metric = load_metric(glue_task("mrpc"))

    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        return metric.compute(predictions=logits.argmax(-1), references=labels)

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, per_device_eval_batch_size=8,
                                 learning_rate=5e-5, num_train_epochs=3, max_steps=max_steps or -1,
                                 lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0, seed=42,
                                 save_strategy="no", eval_strategy="no", report_to=[], logging_steps=50,
                                 use_cpu=not torch.cuda.is_available())
        run = Trainer(model=model, args=args, train_dataset=tokenized["train"], data_collator=DataCollatorWithPadding(tokenizer),
                      compute_metrics=compute_metrics, processing_class=tokenizer)
        train_start = time.perf_counter()
        output = run.train()
        _sync()
        train_seconds = time.perf_counter() - train_start
        result = run.evaluate(tokenized["validation"])
    steps = output.global_step
    return {"samples": steps * 8, "steps": steps, "train_seconds": train_seconds, "wall_s": time.perf_counter() - start,
            "accuracy": result["eval_accuracy"], "f1": result["eval_f1"]}


def project(max_steps: int | None, overrides: dict | None = None, checkpoint: str | None = None) -> dict:
    """The project's own stages with params.yaml (its defaults), in a temporary project linked to data/raw and
    models/pretrained: tokenize, train, evaluate on validation.

    ``overrides``: ``{"train": {...}, "evaluate": {...}}`` applied on top of params.yaml (the ablation), validated.
    ``checkpoint``: a Hub id or folder that the download stage's code fetches into the temporary project instead
    of linking models/pretrained (``--checkpoints``); its shape is returned as ``shape``.

    Raises:
        ParamsError: an override names an unknown key or gives a bad value.
        SourceError: ``checkpoint`` can't be found.
    """
    from finetune.training import train
    from stages.download import download_checkpoint
    from stages.evaluate import evaluate_model
    from stages.tokenize import tokenize_splits

    changes = {section: dict(values) for section, values in (overrides or {}).items()}
    changes.setdefault("evaluate", {})["splits"] = ["validation"]
    if max_steps:
        changes.setdefault("train", {})["max_steps"] = max_steps
    params = with_overrides(load_params(), changes, source="benchmark overrides")
    with tempfile.TemporaryDirectory() as tmp:
        paths = Paths(Path(tmp))
        for link, target in ((paths.raw, RAW_DIR), (paths.pretrained, None if checkpoint else PRETRAINED_DIR)):
            link.parent.mkdir(parents=True, exist_ok=True)
            if target:
                link.symlink_to(target.resolve(), target_is_directory=True)
        if checkpoint:
            download_checkpoint(checkpoint, paths.pretrained)
        shape = checkpoint_shape(paths.pretrained)
        start = time.perf_counter()  # without the checkpoint's download
        tokenize_splits(params, paths)
        metrics = train(params, paths)
        result = evaluate_model(params, paths)["validation"]
    return {"samples": metrics["train_samples"], "real_tokens": metrics["real_tokens"], "steps": metrics["steps"],
            "train_seconds": metrics["train_seconds"], "samples_per_second": metrics["samples_per_second"],
            "padding_fraction": metrics["padding_fraction"],
            "wall_s": time.perf_counter() - start, "accuracy": result["accuracy"], "f1": result["f1"], "shape": shape,
            "settings": {k: v for k, v in params.train.model_dump().items()
                         if k in ("batch_size", "lr", "scheduler", "warmup_ratio", "mixed_precision", "group_by_length",
                                  "adamw_impl", "torch_compile", "num_threads")}}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------- machine ceiling and FLOPs

def matmul_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 10) -> float:
    """Dense ``[n, n] @ [n, n]`` throughput in GFLOP/s (2 n^3 FLOPs per product), best of ``repeats``."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        a @ b
        _sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def checkpoint_shape(folder: Path = PRETRAINED_DIR) -> dict:
    """Model type, layers, hidden size, parameters and non-embedding parameters (those outside any
    ``*embeddings*`` module: a lookup costs no FLOPs) of the classifier on a checkpoint folder's encoder."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
    parameters = sum(p.numel() for p in model.parameters())
    embedding = sum(p.numel() for name, p in model.named_parameters() if "embeddings." in name)
    return {"model_type": config.model_type, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
            "parameters": parameters, "non_embedding_parameters": parameters - embedding}


def training_flops(real_tokens: int, mean_length: float, shape: dict | None = None) -> float:
    """Training FLOPs ≈ 6 × non-embedding parameters × real tokens + attention, for a checkpoint of ``shape``
    (``checkpoint_shape``; default models/pretrained's).

    Attention scores and the weighted sum cost 4 · seq · hidden FLOPs per token per layer forward, ×3 for
    forward + backward (Kaplan et al., 2020, https://arxiv.org/abs/2001.08361, table 1), with seq the mean
    real length.
    """
    shape = shape or checkpoint_shape()
    attention = 12 * shape["layers"] * mean_length * shape["hidden"] * real_tokens
    return 6 * shape["non_embedding_parameters"] * real_tokens + attention


# ---------------------------------------------------------------- driver

def run_way(way: str, max_steps: int | None, overrides: dict | None = None, checkpoint: str | None = None) -> dict:
    """Run one way in a fresh Python process; its own peak RSS is added as ``peak_rss_mb``."""
    cmd = [sys.executable, "-m", "benchmarks.benchmark", "--way", way] + (["--max-steps", str(max_steps)] if max_steps else [])
    cmd += ["--overrides", json.dumps(overrides)] if overrides else []
    cmd += ["--checkpoint", checkpoint] if checkpoint else []
    print(f"== {way}: {' '.join(cmd)}", flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# The course's settings in the project's loop, then each speed setting alone, then all of them.
COURSE_SETTINGS = {"train": {"batch_size": 8, "lr": 5e-5, "mixed_precision": "no", "group_by_length": False,
                             "adamw_impl": "default", "torch_compile": False, "num_threads": None},
                   "evaluate": {"batch_size": 8, "sort_by_length": False}}
ABLATION = {
    "course settings": {},
    "length-grouped batches": {"train": {"group_by_length": True}},
    "bf16 autocast": {"train": {"mixed_precision": "bf16"}},
    "fused AdamW": {"train": {"adamw_impl": "fused"}},
    "batch 32": {"train": {"batch_size": 32}},
    "torch.compile": {"train": {"torch_compile": True}},
    "1 thread": {"train": {"num_threads": 1}},
    "all but compile": {"train": {"group_by_length": True, "mixed_precision": "bf16", "adamw_impl": "fused",
                                  "batch_size": 32}},
}


def ablation() -> None:
    """Short runs (SHORT_STEPS optimizer steps) of each ABLATION variant; writes benchmarks/ABLATION.md."""
    rows = []
    for name, change in ABLATION.items():
        overrides = {section: {**COURSE_SETTINGS[section], **change.get(section, {})} for section in COURSE_SETTINGS}
        r = run_way("project", SHORT_STEPS, overrides)
        rows.append((name, r["samples"] / r["train_seconds"], r["padding_fraction"], r["train_seconds"]))
        print(rows[-1], flush=True)
    base = rows[0][1]
    lines = ["# Speed settings, one at a time (short mode)", "",
             "Command: `python -m benchmarks.benchmark --ablation`  ", f"Date: {date.today().isoformat()}  ",
             f"Machine: {machine()['cpu']}, {machine()['cores']} threads", "",
             f"The project's loop with the course's settings (batch 8, fp32, random batches, default AdamW), then each "
             f"setting alone, then all but torch.compile; {SHORT_STEPS} optimizer steps each, train samples/s.", "",
             markdown_table(["variant", "train samples/s", "ratio", "padding fraction", "train s"],
                            [[n, f"{sps:.1f}", f"{sps / base:.2f}x", f"{pad:.3f}", f"{sec:.1f}"]
                             for n, sps, pad, sec in rows])]
    (HERE / "ABLATION.md").write_text("\n".join(lines))
    print((HERE / "ABLATION.md").read_text())


# The base-size runs' recipe (the course's: batch 8, lr 5e-5, linear, no warmup) with the project's speed settings.
CHECKPOINT_SETTINGS = {"train": {"batch_size": 8, "lr": 5e-5, "scheduler": "linear", "warmup_ratio": 0.0}}
CHECKPOINT_STEPS = 200


def compare_checkpoints(checkpoints: list[str], max_steps: int | None, ceiling: dict, out_dir: Path = HERE) -> None:
    """Each checkpoint through the project's stages with the same settings (CHECKPOINT_SETTINGS), one subprocess
    each, ``max_steps`` optimizer steps (None: whole runs); writes CHECKPOINTS.md and checkpoints.json to ``out_dir``.

    Reported per checkpoint: train seconds, train samples/s, peak RSS, training GFLOP/s and, against the first
    checkpoint, the measured time per sample and the ratio of training FLOPs per sample expected from the shapes
    (``training_flops`` at the same tokens: the first checkpoint's real-token count and mean length).
    """
    records = []
    for checkpoint in checkpoints:
        r = run_way("project", max_steps, CHECKPOINT_SETTINGS, checkpoint)
        records.append({"checkpoint": checkpoint, **r["shape"], "steps": r["steps"], "samples": r["samples"],
                        "train_seconds": r["train_seconds"], "samples_per_s": r["samples_per_second"],
                        "peak_rss_mb": r["peak_rss_mb"], "real_tokens": r["real_tokens"],
                        # FLOPs per sample x samples/s: train_seconds is rounded to 0.1 s, too coarse for short runs
                        "train_gflops": training_flops(r["real_tokens"], r["real_tokens"] / r["samples"], r["shape"])
                        / r["samples"] * r["samples_per_second"] / 1e9, "settings": r["settings"]})
    first = records[0]
    tokens, mean_length = first["real_tokens"], first["real_tokens"] / first["samples"]
    for r in records:
        r["expected_flops_ratio"] = training_flops(tokens, mean_length, r) / training_flops(tokens, mean_length, first)
        r["measured_time_ratio"] = first["samples_per_s"] / r["samples_per_s"]
    info = machine()
    command = "python -m benchmarks.benchmark --checkpoints " + " ".join(checkpoints) + (
        " --mode full" if max_steps is None else "")
    lines = [f"# Checkpoints side by side ({'whole runs' if max_steps is None else f'{max_steps} optimizer steps'})",
             "", f"Command: `{command}`  ", f"Date: {date.today().isoformat()}  ",
             f"Machine: {info['cpu']}, {info['cores']} threads, torch {info['torch']}, CPU flags: "
             f"{info['bf16_flags'] or 'no bf16 instructions'}", "",
             f"Settings, the same for each: `{json.dumps(records[0]['settings'])}`", "",
             markdown_table(["checkpoint", "type", "layers × hidden", "parameters", "train s", "train samples/s",
                             "peak RSS MB", "GFLOP/s", "FLOPs per sample, expected ratio", "time per sample, measured ratio"],
                            [[r["checkpoint"], r["model_type"], f"{r['layers']} × {r['hidden']}",
                              f"{r['parameters'] / 1e6:.1f} M", f"{r['train_seconds']:.0f}", f"{r['samples_per_s']:.1f}",
                              f"{r['peak_rss_mb']:.0f}", f"{r['train_gflops']:.0f}", f"{r['expected_flops_ratio']:.2f}",
                              f"{r['measured_time_ratio']:.2f}"] for r in records]).rstrip(), "",
             _ceiling_line(ceiling)]
    (out_dir / "checkpoints.json").write_text(json.dumps(
        {"command": command, "date": date.today().isoformat(), "machine": info, "matmul_ceiling": ceiling,
         "checkpoints": records}, indent=2) + "\n")
    (out_dir / "CHECKPOINTS.md").write_text("\n".join(lines) + "\n")
    print((out_dir / "CHECKPOINTS.md").read_text())


def check_workspace() -> str | None:
    """Why this workspace can't be benchmarked, in one line, or None: every way trains and scores GLUE MRPC (the
    course's task), from data/raw and with params.yaml's data section, so both must be MRPC's."""
    from finetune.errors import ParamsError
    from finetune.tasks import Task

    try:
        data = load_params().data
    except ParamsError as err:
        return str(err).splitlines()[0]
    where = f"data.files {data.files}" if data.files else f"data.dataset {data.dataset!r}, config {data.config!r}"
    restore = ("restore params.yaml's data section (`git checkout params.yaml`, or `dvc exp apply` of an MRPC "
               "experiment), then `dvc repro download`")
    if data.glue_task != "mrpc":
        return f"the benchmark runs on GLUE MRPC, but params.yaml's data is {where}: {restore}"
    try:
        raw_task = Task.load(RAW_DIR).name
    except FileNotFoundError:
        return f"{RAW_DIR}/task.json not found: run `dvc repro download` first"
    if raw_task != "mrpc":
        return f"the benchmark runs on GLUE MRPC, but {RAW_DIR} holds task {raw_task!r}: run `dvc repro download`"
    return None


def measure_ceiling() -> dict:
    """Dense matmul GFLOP/s in fp32, and in bf16 only where the hardware has bf16 (``resolve_mixed_precision``):
    a CPU without AVX512-BF16 emulates it, and one bf16 product of 2048² ran for minutes there."""
    has_bf16 = resolve_mixed_precision("auto") == "bf16"
    return {"fp32_gflops": matmul_gflops(torch.float32),
            "bf16_gflops": matmul_gflops(torch.bfloat16) if has_bf16 else None}


def _ceiling_line(ceiling: dict) -> str:
    bf16 = f"{ceiling['bf16_gflops']:.0f} GFLOP/s" if ceiling["bf16_gflops"] else "not measured (no bf16 hardware)"
    return f"Matmul ceiling (2048², best of 10): fp32 {ceiling['fp32_gflops']:.0f} GFLOP/s, bf16 {bf16}."


def machine() -> dict:
    info = {"cpu": cpu_model(), "cores": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "bf16_flags": " ".join(cpu_bf16_flags())}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def report(records: list[dict], ceiling: dict, mode: str, command: str) -> str:
    """The Markdown table of RESULTS.md."""
    info = machine()
    lines = [f"# Benchmark ({mode} mode)", "",
             f"Command: `{command}`  ", f"Date: {date.today().isoformat()}  ",
             f"Machine: {info['cpu']}, {info['cores']} threads, torch {info['torch']}" + (f", {info['gpu']}" if "gpu" in info else ""),
             "", markdown_table(
                 ["way", "train samples/s", "wall s", "peak RSS MB", "val accuracy", "val F1", "samples/s ratio",
                  "wall ratio"],
                 [[r["name"], f"{r['samples_per_s']:.1f}", f"{r['wall_s']:.0f}", f"{r['peak_rss_mb']:.0f}",
                   f"{r['accuracy']:.4f}", f"{r['f1']:.4f}", f"{r['ratio_to_course_loop']:.2f}x",
                   f"{r['wall_ratio_to_course_loop']:.2f}"] for r in records]).rstrip()]
    lines += ["", _ceiling_line(ceiling)]
    for r in records:
        if "train_tflops" in r:
            bf16 = (f", {100 * r['fraction_of_bf16_ceiling']:.0f} % of bf16" if r.get("fraction_of_bf16_ceiling")
                    else "")
            lines.append(f"{r['name']}: training at {r['train_gflops']:.1f} GFLOP/s = {100 * r['fraction_of_fp32_ceiling']:.0f} % "
                         f"of the fp32 ceiling{bf16} (6 × non-embedding parameters × real tokens + attention).")
    project_settings = next((r.get("settings") for r in records if r["name"] == "project"), None)
    if project_settings:
        lines += ["", f"Project settings (params.yaml): `{json.dumps(project_settings)}`"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["short", "full"], default="short")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=WAYS)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # internal: run one way, print JSON
    parser.add_argument("--max-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--overrides", type=json.loads, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)  # internal: the project way on this checkpoint
    parser.add_argument("--checkpoints", nargs="+", metavar="CHECKPOINT",
                        help=f"the project's stages on each checkpoint with the same settings, side by side "
                             f"({CHECKPOINT_STEPS} optimizer steps each; --mode full: whole runs)")
    parser.add_argument("--out-dir", type=Path, default=HERE, help="where --checkpoints writes (default benchmarks/)")
    parser.add_argument("--ablation", action="store_true",
                        help="short runs of the project's loop with each speed setting alone, then all together")
    args = parser.parse_args()
    problem = check_workspace()
    if problem:
        sys.exit(f"ERROR: python -m benchmarks.benchmark: {problem}")

    if args.way:
        if args.way == "project":
            result = project(args.max_steps, args.overrides, args.checkpoint)
        else:
            result = {"course_loop": course_loop, "trainer": trainer}[args.way](args.max_steps)
        print(json.dumps({**result, "peak_rss_mb": peak_memory_mb()}))
        return
    if args.ablation:
        ablation()
        return

    ceiling = measure_ceiling()
    print(f"matmul ceiling: {ceiling}", flush=True)
    if args.checkpoints:
        steps = args.max_steps or (CHECKPOINT_STEPS if args.mode == "short" else None)
        compare_checkpoints(args.checkpoints, steps, ceiling, args.out_dir)
        return
    max_steps = SHORT_STEPS if args.mode == "short" else None
    results = {way: run_way(way, max_steps) for way in args.ways}
    base = results.get("course_loop")
    records = []
    for way, r in results.items():
        record = {"name": way, "samples_per_s": r["samples"] / r["train_seconds"], "wall_s": r["wall_s"],
                  "peak_rss_mb": r["peak_rss_mb"], "accuracy": r["accuracy"], "f1": r["f1"], "steps": r["steps"],
                  "train_seconds": r["train_seconds"]}
        if base:
            record["ratio_to_course_loop"] = record["samples_per_s"] / (base["samples"] / base["train_seconds"])
            record["wall_ratio_to_course_loop"] = r["wall_s"] / base["wall_s"]
        for key in ("padding_fraction", "settings"):
            if key in r:
                record[key] = r[key]
        if "real_tokens" in r:
            flops = training_flops(r["real_tokens"], r["real_tokens"] / r["samples"])
            record["train_gflops"] = flops / r["train_seconds"] / 1e9
            record["train_tflops"] = flops / 1e12
            record["fraction_of_fp32_ceiling"] = record["train_gflops"] / ceiling["fp32_gflops"]
            record["fraction_of_bf16_ceiling"] = (record["train_gflops"] / ceiling["bf16_gflops"]
                                                  if ceiling["bf16_gflops"] else None)
        records.append(record)
    suffix = "" if args.mode == "full" else "-short"
    command = "python -m benchmarks.benchmark --mode " + args.mode + ("" if args.ways == WAYS else " --ways " + " ".join(args.ways))
    (HERE / f"results{suffix}.json").write_text(json.dumps(
        {"mode": args.mode, "command": command, "date": date.today().isoformat(), "machine": machine(),
         "matmul_ceiling": ceiling, "ways": records}, indent=2) + "\n")
    (HERE / f"RESULTS{suffix}.md").write_text(report(records, ceiling, args.mode, command))
    print((HERE / f"RESULTS{suffix}.md").read_text())


if __name__ == "__main__":
    main()
