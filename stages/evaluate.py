"""Stage evaluate: the fine-tuned model's (models/trained) metrics and predictions on ``evaluate.splits``
(``finetune.evaluate.predictions.evaluate_model``), in as many processes as ``train.accelerate_config`` asks for.
Writes metrics/eval.json ``{split: {"loss", <the task's metrics>, "examples", "baseline", "most_predicted",
"collapsed"}}`` (unlabeled splits: ``{"examples"}``), data/predictions/<split>.csv and, per labeled split, DVCLive's
plots under dvclive/evaluate/plots/.
"""

from __future__ import annotations

from finetune.launch import launch_if_distributed
from finetune.params import load_params
from finetune.paths import Paths
from finetune.runtime import run_stage, write_json


def main() -> None:
    params, paths = load_params(), Paths()
    launch_if_distributed("stages.evaluate", params.train.accelerate_config)
    # Imported after the hand-over: a process that only starts `accelerate launch` never loads torch.
    from accelerate import PartialState

    from finetune.evaluate.predictions import evaluate_model

    results = evaluate_model(params, paths)
    if PartialState().is_main_process:
        write_json(paths.metrics / "eval.json", results)


if __name__ == "__main__":
    run_stage(main)
