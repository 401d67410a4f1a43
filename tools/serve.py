"""Serve a form of the fine-tuned model over HTTP on LitServe (docs/serving.md, "Serving over HTTP"): the engine
batches concurrent requests, ``finetune.inference.predictor.Predictor`` scores each batch as ``tools.predict`` scores
a file.

    python -m tools.serve                         # metrics/export.json's fastest_at_parity form, 127.0.0.1:8000
    python -m tools.serve --form onnx-fp32 --max-batch-size 32 --batch-timeout 0.001
    python -m tools.serve --form pytorch          # models/finetuned as trained, fp32
    python -m tools.serve --form pytorch --device cuda  # the same on the GPU, in bf16 (fp16 where it lacks bf16)
    python -m tools.serve --exported served       # a folder of forms: dvc artifacts get . text-classifier-served ...
    curl -s localhost:8000/predict -H 'Content-Type: application/json' \\
      -d '{"inputs": {"text": "The cat sat on the mat.", "text_pair": "A cat was sitting on the mat."}}'

``POST /predict`` takes ``{"inputs": example}`` or ``{"inputs": [example, ...]}``: an example is
``{"text": ..., "text_pair": ...}`` for a pair task, a string or ``{"text": ...}`` for a single-text task. It answers
``{"predictions": [{"label": name, "probabilities": {name: p, ...}}, ...]}`` in the examples' order (regression:
``{"score": s}``). Texts are truncated where the model was trained and evaluated (``--max-length`` changes it). A
malformed request gets a 4xx whose ``error`` names the field or limit, and never fails the requests batched with it.
``GET /health`` answers 200 once the model is loaded, ``GET /info`` the settings. SIGTERM: the requests accepted are
answered, then the server exits 0. The request model and the model worker: tools/serve_api.py; the processes' life
(drain, deadline, signals, port): tools/serve_lifecycle.py.
"""

import argparse
import logging
import os
from pathlib import Path

import litserve as ls
import torch
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from finetune.errors import ExportError, ParamsError, PipelineError
from finetune.export.registry import FORMS, form_folder
from finetune.export.speed import EXPORT_METRICS, served_form
from finetune.inference.predictor import PYTORCH, read_model_folder
from finetune.inference.runtimes import OpenVinoClassifier
from finetune.runtime import run_stage
from tools.cli import port, positive_float, positive_int, seconds
from tools.serve_api import FormAPI, PredictRequest, refusal
from tools.serve_lifecycle import Deadline, check_port, stop_on_signals, timed_out

log = logging.getLogger("tools.serve")


def check_flags(args: argparse.Namespace, form: str) -> bool:
    """Check the flags that depend on each other or on ``form``; return whether ``form`` is an OpenVINO form.

    Raises:
        PipelineError: ``--batch-timeout`` not below ``--timeout``; ``--device cuda`` for a form other than
            ``pytorch``, or torch sees no CUDA GPU; ``--openvino-hint`` for a form that is not OpenVINO's.
    """
    if args.batch_timeout >= args.timeout:
        raise PipelineError(f"--batch-timeout {args.batch_timeout:g}: must be less than --timeout {args.timeout:g} "
                            "(a request would time out while its batch fills)")
    if args.device == "cuda":
        if form != PYTORCH:
            raise PipelineError(f"--device cuda: serves the {PYTORCH} form only (the exported forms are CPU "
                                f"runtimes); add --form {PYTORCH}")
        if not torch.cuda.is_available():
            raise PipelineError(f"--device cuda: torch {torch.__version__} sees no CUDA GPU")
    openvino = form != PYTORCH and form in FORMS and FORMS[form].load is OpenVinoClassifier
    if args.openvino_hint is not None and not openvino:
        raise PipelineError(f"--openvino-hint: for the openvino-* forms only, not {form}; drop it or choose one")
    return openvino


def serve(args: argparse.Namespace) -> None:
    """Serve ``args.form`` (None: ``served_form``) on ``args.device`` until SIGTERM or Ctrl-C, with ``main``'s
    settings. The folder's config.json and tokenizer are read here once, to check the folder and decide the
    truncation (``args.max_length``, else the model's); the model worker loads the model.

    Raises:
        ExportError: the form is unknown, not exported, its folder incomplete (``read_model_folder``) or not
            loadable by the model worker (one line naming the folder), or metrics/export.json names none when
            ``form`` is None.
        ParamsError: ``--max-length`` is above the model's positions.
        PipelineError: a flag that does not fit the form or another flag (``check_flags``); the port can't be
            listened on.
    """
    log.setLevel(args.log_level.upper())
    form = args.form or served_form()
    openvino = check_flags(args, form)
    folder = form_folder(form, args.model, args.exported)
    try:  # a missing or incomplete folder stops start-up here, in one line
        task, _, _, args.max_length = read_model_folder(folder, form == PYTORCH, max_length=args.max_length,
                                                        max_length_key="--max-length")
    except ParamsError:
        raise
    except PipelineError as err:
        make = "dvc repro train (or dvc pull)" if form == PYTORCH else "dvc repro export"
        raise ExportError(f"{folder}: incomplete ({err}); make it again with {make}") from None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    args.num_threads = args.num_threads or max(1, cpus // args.workers_per_device)
    check_port(args.host, args.port)
    PredictRequest.pair, PredictRequest.max_examples = len(task.text_columns) == 2, args.max_examples
    open_options = {"max_length": args.max_length, "max_length_key": "--max-length", "num_threads": args.num_threads,
                    "load_options": {"performance_hint": args.openvino_hint} if openvino else None}
    api = FormAPI(form, folder, open_options, args.pad_to_multiple_of, args.fill_rows, args.tokenizer_threads,
                  args.log_level, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout)
    info = {"form": form, "folder": str(folder), "task": task.name, "labels": task.label_names,
            **{k: v for k, v in vars(args).items() if k not in ("form", "model", "exported")}}  # GET /info
    server = ls.LitServer(api, accelerator=args.device, devices=1, workers_per_device=args.workers_per_device,
                          timeout=args.timeout, max_payload_size=args.max_body_bytes,
                          restart_workers=args.restart_workers, model_metadata=info,
                          middlewares=[(Deadline, {"timeout": args.timeout})])

    async def refused(request, err: RequestValidationError) -> JSONResponse:
        status, message = refusal(err.errors())
        return JSONResponse({"error": message}, status_code=status)

    async def answered(request, err: HTTPException) -> JSONResponse:
        message = {413: f"body: over the limit of {args.max_body_bytes} bytes (--max-body-bytes)",  # LitServe's
                   504: timed_out(args.timeout)}.get(err.status_code, str(err.detail))  # limit and timeout
        return JSONResponse({"error": message}, status_code=err.status_code)

    server.app.add_exception_handler(RequestValidationError, refused)
    server.app.add_exception_handler(HTTPException, answered)
    stopped = stop_on_signals(server)
    log.info("Serving %s (%s) on %s, http://%s:%d/predict: batches of up to %d requests, waiting up to %g s, texts "
             "truncated at %d tokens, %d model worker(s) of %d CPU thread(s)", form, folder, args.device, args.host,
             args.port, args.max_batch_size, args.batch_timeout, args.max_length, args.workers_per_device,
             args.num_threads)
    server.run(host=args.host, port=args.port, log_level=args.log_level, generate_client_file=False, access_log=False)
    if stopped == [1]:
        raise ExportError(f"{folder}: the model worker could not load the {form} form (logged above); stopped")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", default=None, help=f"{PYTORCH} (--model, fp32) or a form of --exported: "
                        f"{', '.join(FORMS)}; default: fastest_at_parity.batch_32 of {EXPORT_METRICS}")
    parser.add_argument("--model", type=Path, default=Path("models/finetuned"), help="fine-tuned model folder")
    parser.add_argument("--exported", type=Path, default=Path("models/exported"),
                        help="a folder of exported forms: the export stage's, or the registry's text-classifier-served")
    parser.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1", "0.0.0.0", "::"])
    parser.add_argument("--port", type=port, default=8000)
    parser.add_argument("--max-batch-size", type=positive_int, default=32,
                        help="requests the engine batches into one model call, and examples per forward pass")
    parser.add_argument("--batch-timeout", type=seconds, default=0.001,
                        help="seconds the engine waits for a batch to fill")
    parser.add_argument("--timeout", type=positive_float, default=30,
                        help="seconds a request may wait for its answer before a 504")
    parser.add_argument("--max-examples", type=positive_int, default=64, help="examples per request")
    parser.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="bytes per request body")
    parser.add_argument("--max-length", type=positive_int, default=None, help="truncation in tokens (default: the "
                        "model's, the length it was trained and evaluated with: its tokenizer's model_max_length)")
    parser.add_argument("--pad-to-multiple-of", type=positive_int, default=16,
                        help="pad each batch's length to a multiple of this (few input shapes)")
    parser.add_argument("--fill-rows", action="store_true", help="fill each batch up to 1, 2, 4, 8, then multiples of "
                        "8 rows (fewer shapes, more work: for a runtime that compiles each new shape slowly)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: the pytorch form on the GPU in bf16 (fp16 where the GPU lacks bf16)")
    parser.add_argument("--workers-per-device", type=positive_int, default=1,
                        help="model workers (processes, each with the model), LitServe's workers_per_device")
    parser.add_argument("--num-threads", type=positive_int, default=None,
                        help="CPU threads per model worker (default: this machine's CPUs / --workers-per-device)")
    parser.add_argument("--restart-workers", action=argparse.BooleanOptionalAction, default=True,
                        help="restart a model worker that died (LitServe's restart_workers)")
    parser.add_argument("--tokenizer-threads", action=argparse.BooleanOptionalAction, default=False,
                        help="tokenize each batch on the tokenizers library's thread pool (TOKENIZERS_PARALLELISM); "
                        "off by default: a batch of short texts gains nothing, and the pool's threads spin on the "
                        "cores the model and the HTTP process need")
    parser.add_argument("--openvino-hint", default=None, choices=["LATENCY", "THROUGHPUT"],
                        help="an openvino-* form's PERFORMANCE_HINT (default: OpenVINO's own)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    run_stage(lambda: serve(args))


if __name__ == "__main__":
    main()
