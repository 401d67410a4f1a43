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
``{"score": s}``). A malformed request gets a 4xx whose ``error`` names the field or limit. ``GET /health`` answers
200 once the model is loaded, ``GET /info`` the settings. SIGTERM: the requests accepted are answered, then the
server exits 0.
"""

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Annotated, ClassVar

import litserve as ls
import torch
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, field_validator
from starlette.exceptions import HTTPException

from finetune.errors import ExportError, PipelineError
from finetune.export.registry import FORMS, form_folder, open_form
from finetune.export.speed import EXPORT_METRICS, served_form
from finetune.inference.predictor import PYTORCH, row_buckets
from finetune.modeling import check_checkpoint
from finetune.runtime import run_stage
from finetune.tasks import Task
from tools.cli import port, positive_int, seconds

log = logging.getLogger("tools.serve")


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("empty text (empty or only whitespace)")
    return text


class Example(BaseModel):
    """One example: ``text`` and, for a pair task, ``text_pair`` (``pipeline("text-classification")``'s names)."""

    model_config = ConfigDict(extra="forbid")
    text: Annotated[str, AfterValidator(_not_blank)]
    text_pair: Annotated[str, AfterValidator(_not_blank)] | None = None


class PredictRequest(BaseModel):
    """A ``POST /predict`` body, checked in the HTTP process: one example or a list of 1 to ``max_examples``, each
    with the fields the task reads (``pair``); a single-text task also takes a string. Both class settings are set by
    ``serve`` before the HTTP processes start.

    Raises:
        ValueError: naming the field (``inputs[3].text_pair``) or the limit.
    """

    model_config = ConfigDict(extra="forbid")
    pair: ClassVar[bool] = True
    max_examples: ClassVar[int] = 64

    inputs: list[Example]

    @field_validator("inputs", mode="before")
    @classmethod
    def _listed(cls, inputs):
        items = inputs if isinstance(inputs, list) else [inputs]
        if not 1 <= len(items) <= cls.max_examples:
            raise ValueError(f": {len(items)} examples; give one example or a list of 1 to {cls.max_examples} per "
                             "request (--max-examples)")
        return [{"text": item} if isinstance(item, str) and not cls.pair else item for item in items]

    @field_validator("inputs")
    @classmethod
    def _task_fields(cls, examples: list[Example]) -> list[Example]:
        for i, example in enumerate(examples):
            if (example.text_pair is None) == cls.pair:
                reads = "['text', 'text_pair']" if cls.pair else "one text, ['text']"
                raise ValueError(f"[{i}].text_pair: {'missing' if cls.pair else 'not read'}; this model reads {reads}")
        return examples


class FormAPI(ls.LitAPI):
    """The model of ``form`` in ``folder`` behind LitServe: each batch of requests scored by ``Predictor.logits`` in
    chunks of at most ``max_batch_size`` examples, padded to a multiple of ``pad_multiple`` tokens and, with
    ``fill_rows``, filled up to a ``row_buckets`` size, so a runtime that compiles each shape meets few of them. On
    ``cuda`` (the ``pytorch`` form only) the model runs in bf16, fp16 where the GPU lacks bf16."""

    def __init__(self, form: str, folder: Path, pad_multiple: int, fill_rows: bool, log_level: str, **batching):
        super().__init__(**batching)
        self.form, self.folder, self.log_level = form, folder, log_level
        self.pad_multiple, self.fill_rows = pad_multiple, fill_rows

    def setup(self, device: str) -> None:
        logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")
        log.setLevel(self.log_level.upper())
        outlive_sigterm()
        dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if device != "cpu" else None
        try:
            self.predictor = open_form(self.folder, self.form, device=device, dtype=dtype)
        except PipelineError as err:  # at start-up, or restarting after a crash: the server stops, exit status 1
            log.error("%s; stopping the server", err)
            os.kill(os.getppid(), signal.SIGUSR1)
            raise SystemExit(1) from None
        columns = len(self.predictor.task.text_columns)
        for length in range(self.pad_multiple, min(self.predictor.max_length, 128) + 1, self.pad_multiple):
            words = " ".join(["word"] * max(1, length // columns - 2))  # one pass per shape: OpenVINO compiles each
            for rows in row_buckets(self.max_batch_size):
                self.predict([[(words,) * columns] * rows])

    def decode_request(self, request: PredictRequest) -> list[tuple[str, ...]]:
        return [(e.text,) if e.text_pair is None else (e.text, e.text_pair) for e in request.inputs]

    def batch(self, inputs: list[list[tuple[str, ...]]]) -> list[list[tuple[str, ...]]]:
        return inputs

    def predict(self, requests: list[list[tuple[str, ...]]]) -> list[list[dict]]:
        rows = [row for request in requests for row in request]
        log.debug("batch: %d requests, %d examples", len(requests), len(rows))
        answers = iter(self.predictor.answers(self.predictor.logits(
            rows, batch_size=self.max_batch_size, pad_to_multiple_of=self.pad_multiple, fill_rows=self.fill_rows)))
        return [[next(answers) for _ in request] for request in requests]

    def unbatch(self, outputs: list[list[dict]]) -> list[list[dict]]:
        return outputs

    def encode_response(self, output: list[dict]) -> dict:
        return {"predictions": output}


def refusal(errors: list[dict], max_body_bytes: int) -> tuple[int, str]:
    """The status and one-line ``error`` of a request pydantic refused: the first error, its field written as
    ``inputs[1].text_pair``."""
    first = errors[0]
    if first.get("type") == "json_invalid":
        return 400, f"body: not valid JSON ({first.get('ctx', {}).get('error', 'invalid')})"
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.get("loc", ())[1:]).lstrip(".")
    if not where:
        return 422, "body: expected a JSON object such as {\"inputs\": ...}, sent as Content-Type: application/json"
    message = first.get("msg", "").removeprefix("Value error, ")
    return 422, f"{where}{message}" if message.startswith((":", "[")) else f"{where}: {message}"


def stop_on_signals(server: ls.LitServer) -> list[int]:
    """SIGTERM: the HTTP processes stop accepting and answer what they accepted (uvicorn's graceful shutdown, within
    ``Deadline``) while the model worker still runs; then LitServe stops the rest and ``run`` returns. SIGUSR1, from a
    model worker that can't load the model (``FormAPI.setup``): the same, then exit status 1. Before the HTTP
    processes start, nothing was accepted: everything stops at once. Own code, as LitServe drains only on Ctrl-C,
    and closes its response queues before its HTTP processes have answered.

    Returns:
        A list that holds the exit status once a signal came (empty until then).
    """
    main_pid, status = os.getpid(), []

    def drain() -> None:
        http = [p for p in multiprocessing.active_children() if p.name.startswith("LitServer-")]
        if not http:  # still starting: nothing was accepted
            for process in multiprocessing.active_children():
                process.kill()
            os._exit(status[0])
        for process in http:
            process.terminate()
        for process in http:
            process.join(timeout=60)
        for process in multiprocessing.active_children():  # nothing is left for the model workers to answer
            if process.name == "inference-worker":
                process.kill()
                process.join(timeout=5)
        log.info("Answered the accepted requests; stopping")
        server._shutdown_event.set()

    def on_signal(signum, frame) -> None:
        if os.getpid() != main_pid or status:  # a helper forked from this process, or already stopping
            return
        status.append(1 if signum == signal.SIGUSR1 else 0)
        log.info("%s: answering accepted requests, then stopping", signal.Signals(signum).name)
        threading.Thread(target=drain, name="drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    return status


def outlive_sigterm() -> None:
    """In a model worker: a SIGTERM sent to the whole process group (Ctrl-C's way, systemd's) leaves it running
    while its parent drains the HTTP processes, which then stops it; without its parent, it exits."""
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0) if os.getppid() != parent else None)


class Deadline:
    """ASGI middleware: a ``/predict`` request not answered within ``seconds`` gets a 504 naming the limit. Own code:
    LitServe restarts a model worker that died (``restart_workers``), but the requests that worker held are never
    answered, and its own request timeout is kept by the worker."""

    def __init__(self, app, seconds: float):
        self.app, self.seconds = app, seconds

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/predict":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            async with asyncio.timeout(self.seconds):
                await self.app(scope, receive, tracked)
        except TimeoutError:
            if started:
                raise
            log.error("No answer within %g s (--timeout): the model worker is busy, or died and is restarting",
                      self.seconds)
            body = json.dumps({"error": f"no answer from the model within {self.seconds:g} s (--timeout); the "
                                        "model worker is overloaded or restarting: retry"}).encode()
            await send({"type": "http.response.start", "status": 504,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})


def check_port(host: str, port: int) -> None:
    """Raises PipelineError naming ``--port`` when ``host:port`` can't be listened on (in use, or not allowed)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((host, port))
        except OSError as err:
            raise PipelineError(f"--port {port}: can't listen on {host}:{port} ({err.strerror}); stop what "
                                "listens there, or choose another --port") from None


def serve(args: argparse.Namespace) -> None:
    """Serve ``args.form`` (None: ``served_form``) on ``args.device`` until SIGTERM or Ctrl-C, with ``main``'s
    settings.

    Raises:
        ExportError, CheckpointError: the form is unknown, not exported or can't be loaded (one line naming its
            folder), or metrics/export.json names none when ``form`` is None.
        PipelineError: ``--device cuda`` for a form other than ``pytorch``, or torch sees no CUDA GPU; the port can't
            be listened on.
    """
    form = args.form or served_form()
    if args.device == "cuda":
        if form != PYTORCH:
            raise PipelineError(f"--device cuda: serves the {PYTORCH} form only (the exported forms are CPU "
                                f"runtimes); add --form {PYTORCH}")
        if not torch.cuda.is_available():
            raise PipelineError(f"--device cuda: torch {torch.__version__} sees no CUDA GPU")
    folder = form_folder(form, args.model, args.exported)
    try:  # a missing or incomplete folder stops start-up here, in one line; the model worker loads it
        task = Task.load(folder)
        check_checkpoint(folder, need_weights=form == PYTORCH)
    except PipelineError as err:
        make = "dvc repro train (or dvc pull)" if form == PYTORCH else "dvc repro export"
        raise ExportError(f"{folder}: incomplete ({err}); make it again with {make}") from None
    check_port(args.host, args.port)
    PredictRequest.pair, PredictRequest.max_examples = len(task.text_columns) == 2, args.max_examples
    api = FormAPI(form, folder, args.pad_to_multiple_of, args.fill_rows, args.log_level,
                  max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout)
    info = {"form": form, "folder": str(folder), "task": task.name, "labels": task.label_names,
            **{k: v for k, v in vars(args).items() if k not in ("form", "model", "exported")}}  # GET /info
    server = ls.LitServer(api, accelerator=args.device, devices=1, workers_per_device=1, timeout=args.timeout,
                          max_payload_size=args.max_body_bytes, restart_workers=True, model_metadata=info,
                          middlewares=[(Deadline, {"seconds": args.timeout + 1})])

    async def refused(request, err: RequestValidationError) -> JSONResponse:
        status, message = refusal(err.errors(), args.max_body_bytes)
        return JSONResponse({"error": message}, status_code=status)

    async def answered(request, err: HTTPException) -> JSONResponse:
        message = f"body: over the limit of {args.max_body_bytes} bytes (--max-body-bytes)" \
            if err.status_code == 413 else str(err.detail)  # 413: LitServe's max_payload_size
        return JSONResponse({"error": message}, status_code=err.status_code)

    server.app.add_exception_handler(RequestValidationError, refused)
    server.app.add_exception_handler(HTTPException, answered)
    stopped = stop_on_signals(server)
    log.info("Serving %s (%s) on %s, http://%s:%d/predict: batches of up to %d requests, waiting up to %g s", form,
             folder, args.device, args.host, args.port, args.max_batch_size, args.batch_timeout)
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
    parser.add_argument("--timeout", type=seconds, default=30,
                        help="seconds a request may wait for its answer before a 504")
    parser.add_argument("--max-examples", type=positive_int, default=64, help="examples per request")
    parser.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="bytes per request body")
    parser.add_argument("--pad-to-multiple-of", type=positive_int, default=16,
                        help="pad each batch's length to a multiple of this (few input shapes)")
    parser.add_argument("--fill-rows", action="store_true", help="fill each batch up to 1, 2, 4, 8, then multiples of "
                        "8 rows (fewer shapes, more work: for a runtime that compiles each new shape slowly)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: the pytorch form on the GPU in bf16 (fp16 where the GPU lacks bf16)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    run_stage(lambda: serve(args))


if __name__ == "__main__":
    main()
