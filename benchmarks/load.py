"""Load test of the HTTP server (``tools.serve``, LitServe) side by side with a user's baseline and with the bare
engine, on loopback, and a check that what it serves is what the evaluate stage evaluated.

- tools.serve: ``python -m tools.serve`` on the form (``--serve-args`` adds its flags);
- the bare engine (benchmarks/load_bare.py): LitServe over the same form with the same batching and no checks, the
  engine's ceiling here; what ``tools.serve`` loses to it is its own code's;
- the baseline (benchmarks/load_baseline.py): what a user writes first, a FastAPI app calling
  ``pipeline("text-classification")`` in fp32 on the fine-tuned model, one request at a time.

tools.serve and the bare engine alternate ``--rounds`` times, in ABBA order (tools.serve first in odd rounds, the bare
engine in even ones); the baseline runs once, last. Each run sends its levels (1, 8 and 32 clients;
benchmarks/load_client.py) after a few untimed requests, and measures the CPU time of each process of the server at the
top level (benchmarks/load_processes.py). The first tools.serve run first sends the whole validation split, one example
per request, and compares each answer with the evaluate stage's data/predictions/validation.csv
(benchmarks/load_agreement.py). Before the servers, the form alone is timed in-process at batch 32
(``finetune.export.speed.form_speed``, the export stage's timing). ``--project`` names the project folder (default:
here) whose models/finetuned, models/exported, data/predictions, data/tokenized and metrics/ are read; the servers run
this checkout's code.

    python -m benchmarks.load                                    # the served form (metrics/export.json)
    python -m benchmarks.load --serve-args=--no-restart-workers     # one of tools.serve's choices
    python -m benchmarks.load --project ../mpnet --out benchmarks/SERVE-LOAD-MPNET.md   # another project's model
    python -m benchmarks.load --form pytorch --device cuda --rounds 1   # on the GPU (tools.serve in bf16)

Writes benchmarks/SERVE-LOAD.md (``--out``, atomically; benchmarks/load_report.py). Exits 1 after writing it when
more served labels differ from the evaluated ones than the precisions allow (none where both ran in fp32).
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import signal
import sys
from pathlib import Path

from datasets import load_from_disk

from benchmarks import load_client, load_processes
from benchmarks.load_agreement import agreement, allowed_differences, evaluation_precision, served_precision
from benchmarks.load_report import NAMES, goals, headline, medians, report
from finetune.export.registry import form_folder, open_form
from finetune.export.speed import form_speed, served_form
from finetune.hardware import serving_dtype
from finetune.inference.predictor import PYTORCH
from finetune.paths import Paths
from finetune.runtime import run_stage, unwritable, write_text
from finetune.tasks import Task, predictions_of
from tools import cli

HERE = Path(__file__).parent
SERVERS = ("engine", "bare", "baseline")
AGREEMENT_CLIENTS = 8


def server_commands(args: argparse.Namespace, form: str, folder: Path) -> dict[str, list[str]]:
    """Each server's command line, without ``--port``."""
    batching = ["--max-batch-size", str(args.max_batch_size), "--batch-timeout", str(args.batch_timeout)]
    return {"engine": [sys.executable, "-m", "tools.serve", "--form", form, "--model", str(args.model), "--exported",
                       str(args.exported), "--device", args.device, *batching, "--log-level", "warning",
                       *shlex.split(args.serve_args)],
            "bare": [sys.executable, "-m", "benchmarks.load_bare", "--form", form, "--folder", str(folder),
                     "--device", args.device, *batching],
            "baseline": [sys.executable, "-m", "benchmarks.load_baseline", "--model", str(args.model), "--device",
                         args.device]}


def run_server(server: str, command: list[str], port: int, rows: load_client.Rows, args: argparse.Namespace,
               check: bool, soak: int) -> dict:
    """One run of ``server``: started, a few untimed requests, with ``check`` the whole split's answers, every level
    (CPU time by process role at the top one), an optional soak, then SIGTERM.

    Returns:
        ``{"server", "levels", "answers" (None without check), "soak" (None without), "status"}``.
    """
    process = load_processes.start_server([*command, "--port", str(port)], port)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below stops the server
    try:
        load_client.send(port, rows.bodies[:16], 4, 16, 60)  # warm-up
        answers = load_client.answers(port, rows, AGREEMENT_CLIENTS) if check else None
        levels, pids = [], load_processes.roles(process.pid)
        for clients in args.clients:
            before = load_processes.cpu_seconds(pids)
            row = {"server": server, **load_client.level(port, rows, clients, args.requests, args.seconds)}
            if clients == max(args.clients):
                after = load_processes.cpu_seconds(pids)
                row["cpu"] = load_processes.cpu_per_request(pids, before, after, row["requests"] - row["errors"])
            print(json.dumps(row), flush=True)
            levels.append(row)
        soak_row = load_client.level(port, rows, 32, soak, 3600) if soak else None
        if soak_row:
            print(json.dumps({"soak": soak_row}), flush=True)
    finally:
        status = load_processes.stop_server(process)
    return {"server": server, "levels": levels, "answers": answers, "soak": soak_row, "status": status}


def in_process(form: str, folder: Path, project: Path, device: str) -> tuple[float | None, str]:
    """The form's rows/s at batch 32 in this process (``form_speed`` on the project's tokenized validation split),
    and the sentence saying so; None and why where the project has no data/tokenized."""
    tokenized = Paths(project).tokenized
    if not (tokenized / "dataset_dict.json").is_file():
        return None, f"The form in-process: not measured ({tokenized} not found: dvc repro tokenize)."
    print(f"Timing {form} in-process at batch 32")
    dtype = serving_dtype(device)
    predictor = open_form(folder, form, device=device, dtype=dtype)
    speed = form_speed(predictor, load_from_disk(str(tokenized))["validation"])
    del predictor
    gc.collect()
    return speed["batch_32_rows_per_s"], (
        f"The form in-process, before the servers: {speed['batch_32_rows_per_s']} rows/s at batch 32 "
        f"(`finetune.export.speed.form_speed` on the tokenized validation split, tokenizing excluded).")


def rows_off_fp32(model: Path, rows: load_client.Rows, task: Task) -> int:
    """How many of the evaluated labels differ from the PyTorch fp32 model's, scored here on the CPU."""
    texts = list(zip(*(rows.evaluated[column] for column in task.text_columns)))
    labels = predictions_of(open_form(model, PYTORCH).logits(texts), task).tolist()
    gc.collect()
    return sum(task.label_names[label] != evaluated for label, evaluated in zip(labels, rows.evaluated["prediction"]))


def served_as_evaluated(args: argparse.Namespace, paths: Paths, form: str, rows: load_client.Rows, task: Task,
                        own: bool) -> tuple[bool, int | None, str]:
    """Whether tools.serve's answers are checked against the evaluate stage's predictions, how many rows may then
    differ (``allowed_differences``) and the sentence saying why."""
    if "engine" not in args.servers:
        return False, None, "Not checked: tools.serve did not run"
    if rows.evaluated is None:
        return False, None, f"Not checked: no {paths.predictions / 'validation.csv'}"
    if not own:
        return False, None, f"Not checked: --model {args.model} is not the model {paths.predictions} was made with"
    evaluated_in, export = evaluation_precision(paths.metrics / "train.json"), paths.metrics / "export.json"
    if evaluated_in == "fp32":
        off = 0
    else:
        print(f"Scoring the validation split with the PyTorch fp32 model (the {evaluated_in} evaluation's rows off)")
        off = rows_off_fp32(args.model, rows, task)
    allowed, why = allowed_differences(form, evaluated_in, served_precision(form, args.device),
                                       json.loads(export.read_text()) if export.is_file() else {},
                                       len(rows.bodies), off)
    return True, allowed, why


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, default=Path("."),
                        help="the project folder whose model, forms, predictions and metrics are read")
    parser.add_argument("--model", type=Path, help="the fine-tuned model folder (default: models/finetuned there)")
    parser.add_argument("--exported", type=Path, help="its exported forms (default: models/exported there)")
    parser.add_argument("--form", help="the served form (default: the project's metrics/export.json's choice)")
    parser.add_argument("--clients", type=cli.positive_int, nargs="+", default=[1, 8, 32],
                        help="the levels: concurrent clients")
    parser.add_argument("--requests", type=cli.positive_int, default=816, help="requests per level (at most)")
    parser.add_argument("--seconds", type=cli.positive_float, default=60, help="seconds per level (at most)")
    parser.add_argument("--rounds", type=cli.positive_int, default=3,
                        help="runs of tools.serve and of the bare engine each")
    parser.add_argument("--soak", type=cli.non_negative_int, default=0,
                        help="then this many requests from 32 clients to tools.serve")
    parser.add_argument("--max-batch-size", type=cli.positive_int, default=32,
                        help="tools.serve's and the bare engine's")
    parser.add_argument("--batch-timeout", type=cli.seconds, default=0.001, help="tools.serve's and the bare engine's")
    parser.add_argument("--serve-args", default="", help="more flags for tools.serve, one string: "
                        "'--no-restart-workers --workers-per-device 2'")
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: tools.serve and the bare engine serve --form pytorch on the GPU in bf16, the "
                             "baseline's pipeline() runs there in fp32")
    parser.add_argument("--port", type=cli.port, default=8765, help="the first of three ports, one per server")
    parser.add_argument("--out", type=Path, default=HERE / "SERVE-LOAD.md", help="the report")
    args = parser.parse_args(argv)
    try:
        shlex.split(args.serve_args)
    except ValueError as err:
        parser.error(f"argument --serve-args: {err}")
    if problem := unwritable(args.out):
        parser.error(f"argument --out: {args.out}: {problem}")
    paths = Paths(args.project)
    own = args.model is None or args.model.resolve() in (paths.finetuned.resolve(), paths.trained.resolve())
    args.model, args.exported = args.model or paths.finetuned, args.exported or paths.exported
    form = args.form or served_form(paths.metrics / "export.json")
    folder, task = form_folder(form, args.model, args.exported), Task.load(args.model)
    rows = load_client.validation_rows(args.project, task)
    commands = server_commands(args, form, folder)
    rows_per_s, in_process_line = None, "The form in-process: not measured (--model is not --project's model)."
    if own:
        rows_per_s, in_process_line = in_process(form, folder, args.project, args.device)
    check, allowed, why = served_as_evaluated(args, paths, form, rows, task, own)

    # ABBA: tools.serve first in odd rounds, the bare engine first in even ones, so neither always runs first
    pairs = [("engine", "bare") if r % 2 == 0 else ("bare", "engine") for r in range(args.rounds)]
    order = [s for pair in pairs for s in pair if s in args.servers]
    order += ["baseline"] if "baseline" in args.servers else []
    last_engine = max((i for i, s in enumerate(order) if s == "engine"), default=None)
    runs = []
    for i, server in enumerate(order):
        runs.append(run_server(server, commands[server], args.port + SERVERS.index(server), rows, args,
                               check=check and i == 0, soak=args.soak if i == last_engine else 0))
    served = next((r["answers"] for r in runs if r["answers"] is not None), None)
    result = agreement(served, rows.evaluated, allowed) if served is not None else None

    shown = {server: shlex.join(["python", *command[1:]]) for server, command in commands.items()
             if server in args.servers}
    given = argv if argv is not None else sys.argv[1:]
    record = {"command": shlex.join(["python", "-m", "benchmarks.load", *given]), "form": form, "folder": folder,
              "served_in": served_precision(form, args.device), "rows": len(rows.bodies), "requests": args.requests,
              "seconds": args.seconds, "rounds": args.rounds, "commands": shown, "runs": runs,
              "soak": next((r["soak"] for r in runs if r["soak"]), None), "agreement": result,
              "agreement_why": why, "in_process": share_line(runs, rows_per_s, in_process_line)}
    write_text(args.out, report(record))
    by = {server: medians(runs, server) for server in NAMES}
    print("\n".join(headline(by) + ([result.line()] if result else []) + goals(by, result, record["soak"])))
    print(f"Wrote {args.out}")
    if result is not None and result.met is False:
        raise SystemExit(f"ERROR: {result.rows - result.same} of {result.rows} served labels differ from the evaluated "
                         f"ones (idx {result.differing[:20]}), more than allowed: {why}; see {args.out}")


def share_line(runs: list[dict], rows_per_s: float | None, measured: str) -> str:
    """``measured`` (``in_process``'s sentence) and each server's median requests/s at its top level as a share of
    ``rows_per_s``."""
    if rows_per_s is None:
        return measured
    shares = []
    for server, name in (("bare", "the bare engine"), ("engine", "tools.serve")):
        if by := medians(runs, server):
            top = by[max(by)]
            shares.append(f"{name} serves {top['requests_per_s']} requests/s at {top['clients']} clients, "
                          f"{top['requests_per_s'] / rows_per_s:.0%} of it")
    said = "; ".join(shares)
    return f"{measured} {said[:1].upper()}{said[1:]}." if shares else measured


if __name__ == "__main__":
    run_stage(main)  # an expected error (a form not exported, a folder missing) as one line
