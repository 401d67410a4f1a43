"""The project's way: its own stages (tokenize, train, evaluate on validation) in a temporary project whose params
are params.yaml with the benchmark's overrides, validated like params.yaml. ``benchmarks.benchmark`` runs it in its
own subprocess (``--way project``), for the side-by-side, the ablation and ``--checkpoints``."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.machine import checkpoint_shape
from benchmarks.workspace import PRETRAINED_DIR, RAW_DIR
from finetune.overrides import with_overrides
from finetune.params import load_params
from finetune.paths import Paths

# The train params reported with each result (the speed settings and the recipe), as ``settings``.
REPORTED_SETTINGS = ("batch_size", "lr", "scheduler", "warmup_ratio", "mixed_precision", "group_by_length",
                     "adamw_impl", "torch_compile", "num_threads")


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
    # heavy, this way's own: the baselines' subprocesses load none of the pipeline, so their peak RSS is their own
    from finetune.data.download import download_checkpoint
    from finetune.data.tokenized import tokenize_splits
    from finetune.evaluate.predictions import evaluate_model
    from finetune.train.recipe import train

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
            "settings": {k: v for k, v in params.train.model_dump().items() if k in REPORTED_SETTINGS}}
