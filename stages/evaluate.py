"""Stage 6, evaluate: the task's metrics of the fine-tuned model (models/trained) on validation and test (where
they exist and have labels), with predictions for every split.

The work is ``finetune.evaluate.predictions.evaluate_model``. Run as ``python -m stages.evaluate`` (dvc.yaml): one process, or
when ``train.accelerate_config`` asks for more, the stage hands itself over to ``accelerate launch`` before it imports
torch (``finetune.runtime.launch_if_distributed``). Writes metrics/eval.json ``{"validation": {"loss", <the task's
metrics>, "examples", "baseline", "most_predicted", "collapsed"}, "test": {...}}`` (one shape per task, e.g. MRPC:
accuracy and F1; the last three are the collapse check, ``finetune.evaluate.collapse``), data/predictions/<split>.csv (see
``finetune.evaluate.predictions.prediction_table``; written in chunks, so a split of 400 k rows never sits in memory as one
table of texts) and, per labeled split, DVCLive's plots under dvclive/evaluate/plots/ (``finetune.train.live.log_plots``).
"""

from __future__ import annotations

from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import launch_if_distributed, run_stage, write_json


def main() -> None:
    params, paths = load_params(), Paths()
    launch_if_distributed("stages.evaluate", params.train.accelerate_config)
    from accelerate import PartialState

    from finetune.evaluate.predictions import evaluate_model

    results = evaluate_model(params, paths)
    if PartialState().is_main_process:
        write_json(paths.metrics / "eval.json", results)


if __name__ == "__main__":
    run_stage(main)
