"""The scale check on a GPU machine (benchmarks/SCALE.md, "On a GPU"): the train stage's cost on 404 k SST-2 rows with
validation and checkpoints every N steps, and a run stopped mid-epoch and resumed against an uninterrupted one.

Written for a machine that has torch, transformers and accelerate but no DVC: the stages' functions are called
directly (download_dataset, tokenize_splits, train) in projects under /tmp/proj, and DVCLive (which needs dvc) is
replaced by a logger that writes nothing. The MiniLM is randomly initialised from the embedded checkpoint's config,
so speed and mechanics are real and accuracy is not. Needs, in .gpu/ of the checkout: minilm/ (the embedded
checkpoint's config and tokenizer files), sst2/ (the local GLUE copy's SST-2 parquet files) and the wheels the
machine lacks (datasets, evaluate, pydantic, ruamel.yaml, transformers 5.24 with its hub client).

    python3 benchmarks/scale_gpu.py           # writes $OUT/gpu_check.json (kept as benchmarks/scale-gpu.json)
    SMALL=1 python benchmarks/scale_gpu.py    # a dry run on a CPU: 200 rows, a few steps
"""
import json, os, shutil, sys, time
from pathlib import Path

REPO = Path.cwd()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
sys.path.insert(0, str(REPO))

import pandas as pd
import torch

import finetune.live as live


class NoLive:
    step = 0
    def log_metric(self, *a, **k): pass
    def log_sklearn_plot(self, *a, **k): pass
    def make_summary(self): pass
    def end(self): pass


live.open_live = lambda d: NoLive()

from transformers import AutoConfig, AutoModel, AutoTokenizer  # noqa: E402

from finetune import training  # noqa: E402
from finetune.params import load_params, with_overrides  # noqa: E402
from finetune.paths import Paths  # noqa: E402
from stages.download import download_dataset  # noqa: E402
from stages.tokenize import tokenize_splits  # noqa: E402
from tests.helpers import reset_accelerate  # noqa: E402

SMALL = os.environ.get("SMALL") == "1"  # a dry run on a CPU: few rows and steps
results = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "torch": torch.__version__}


def project(name: str, repeat: int, train: dict) -> tuple:
    root = Path("/tmp/proj") / name
    shutil.rmtree(root, ignore_errors=True)
    (root / "data/own").mkdir(parents=True)
    shutil.copytree(REPO / "configs", root / "configs")
    frames = {s: pd.read_parquet(next((REPO / ".gpu/sst2").glob(f"{s}-*.parquet")))[["sentence", "label"]]
              for s in ("train", "validation")}
    frames["train"] = pd.concat([frames["train"]] * repeat, ignore_index=True)
    if SMALL:
        frames = {k: f.iloc[:200] for k, f in frames.items()}
    for s, f in frames.items():
        f.to_parquet(root / f"data/own/{s}.parquet", index=False)
    os.chdir(root)
    params = with_overrides(load_params(REPO / "params.yaml"), {
        "data": {"dataset": None, "config": None, "local_copy": None, "text_columns": ["sentence"],
                 "label_names": ["negative", "positive"],
                 "files": {"train": "data/own/train.parquet", "validation": "data/own/validation.parquet",
                           "test": None}},
        "train": train, "evaluate": {"splits": ["validation"]}})
    paths = Paths(root)
    t = time.perf_counter()
    download_dataset(params.data, paths.raw)
    download_s = time.perf_counter() - t
    config = AutoConfig.from_pretrained(REPO / ".gpu/minilm")
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(paths.pretrained)
    AutoTokenizer.from_pretrained(REPO / ".gpu/minilm").save_pretrained(paths.pretrained)
    t = time.perf_counter()
    tokenize_splits(params, paths)
    return params, paths, {"download_s": round(download_s, 1), "tokenize_s": round(time.perf_counter() - t, 1)}


# 1. cost on 404 k rows: 2000 steps of batch 32, validation every 500, a checkpoint every 250
steps = 20 if SMALL else 2000
params, paths, cost = project("scale", 6, {"max_steps": steps, "batch_size": 32, "eval_every_steps": steps // 4,
                                           "save_every_steps": steps // 8, "save_total_limit": 2})
t = time.perf_counter()
metrics = training.train(params, paths)
cost["train_call_s"] = round(time.perf_counter() - t, 1)
cost["train"] = {k: metrics.get(k) for k in ("steps", "evaluations", "best_step", "train_samples", "train_seconds", "samples_per_second", "wall_seconds",
                                         "peak_memory_mb", "peak_gpu_memory_mb", "mixed_precision", "device")}
cost["checkpoints_left"] = sorted(p.name for p in paths.checkpoints.glob("step-*"))
results["scale_404k"] = cost
print(json.dumps(cost), flush=True)
reset_accelerate()

# 2. a run stopped mid-epoch (step 175 of 300, after the checkpoint at 150) and resumed, against an uninterrupted one
train = {"max_steps": 300, "batch_size": 32, "eval_every_steps": 100, "save_every_steps": 50, "keep_best": False}
if SMALL:
    train = {"max_steps": 12, "batch_size": 8, "eval_every_steps": 4, "save_every_steps": 2, "keep_best": False}
params, paths, _ = project("whole", 1, train)
whole = training.train(params, paths)
from safetensors.torch import load_file  # noqa: E402
expected = load_file(paths.trained / "model.safetensors")
reset_accelerate()
params, paths, _ = project("stopped", 1, train)
log_step = training.TrainLog.log_step


def stop(self, step, *a):
    if step == (7 if SMALL else 175):
        raise KeyboardInterrupt
    return log_step(self, step, *a)


training.TrainLog.log_step = stop
try:
    training.train(params, paths)
except KeyboardInterrupt:
    pass
training.TrainLog.log_step = log_step
reset_accelerate()
resumed = training.train(params, paths)
weights = load_file(paths.trained / "model.safetensors")
diff = max((weights[k].float() - expected[k].float()).abs().max().item() for k in weights)
results["resume"] = {"resumed_from_step": resumed["resumed_from_step"], "max_abs_weight_diff": diff,
                     "bit_equal": all(weights[k].equal(expected[k]) for k in weights),
                     "metrics_equal": {k: v for k, v in whole.items() if "second" not in k and "memory" not in k
                                       and k != "resumed_from_step"} ==
                                      {k: v for k, v in resumed.items() if "second" not in k and "memory" not in k
                                       and k != "resumed_from_step"},
                     "mixed_precision": resumed["mixed_precision"]}
print(json.dumps(results["resume"]), flush=True)
OUT.mkdir(parents=True, exist_ok=True)
(OUT / "gpu_check.json").write_text(json.dumps(results, indent=1))
