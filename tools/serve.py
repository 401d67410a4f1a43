"""Serve a form of the fine-tuned model over HTTP on LitServe (docs/serving.md, "Serving over HTTP"): the engine
batches concurrent requests, the form's own tokenizer truncates as in training, and texts are checked by the function
that prepares ``tools.predict``'s files.

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
``{"score": s}``). ``GET /health`` answers 200 once the model is loaded (503 before), ``GET /info`` the settings.
SIGTERM: the requests accepted are answered, then the server exits 0.
"""

import argparse
import json
import logging
import multiprocessing
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import litserve as ls
import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, field_validator

from finetune.data.checks import clean_texts
from finetune.errors import DataError, ExportError, PipelineError
from finetune.export.registry import FORMS, PYTORCH
from finetune.runtime import run_stage
from tools.cli import positive_int

log = logging.getLogger("tools.serve")

EXPORT_METRICS = Path("metrics/export.json")
PAIR_FIELDS = ("text", "text_pair")  # an example's fields, as pipeline("text-classification") takes them


@dataclass(frozen=True)
class Limits:
    """What a request may hold: ``pair`` (the task reads two texts), ``max_examples`` per request, ``max_body_bytes``
    per body."""

    pair: bool
    max_examples: int
    max_body_bytes: int


class PredictRequest(BaseModel):
    """A ``POST /predict`` body, checked in the HTTP process before it is queued for the model: ``inputs`` becomes a
    list of examples, each a tuple of one text (single-text task) or two (pair task).

    Raises:
        ValueError: naming the field (``inputs[3].text_pair``) and, for a count, the limit: not one example or a
            list of them, more than ``limits.max_examples``, a missing, unknown or non-string field, or an empty text
            (``finetune.data.checks.clean_texts``).
    """

    model_config = ConfigDict(extra="forbid")
    limits: ClassVar[Limits | None] = None  # set by ``serve`` before the HTTP processes start

    inputs: Any

    @field_validator("inputs")
    @classmethod
    def _examples(cls, inputs: Any) -> list[tuple[str, ...]]:
        limits = cls.limits
        many = isinstance(inputs, list)
        items = inputs if many else [inputs]
        if not items:
            raise ValueError("inputs: an empty list; give one example or a list of 1 to "
                             f"{limits.max_examples}")
        if len(items) > limits.max_examples:
            raise ValueError(f"inputs: {len(items)} examples, more than the limit of {limits.max_examples} per "
                             "request (--max-examples); split them over several requests")
        fields = PAIR_FIELDS if limits.pair else PAIR_FIELDS[:1]
        rows = [_example(item, f"inputs[{i}]" if many else "inputs", fields) for i, item in enumerate(items)]
        table = pd.DataFrame(rows, columns=list(fields))
        table.attrs["numbered"] = True
        try:
            clean_texts(table, fields, "request", "inputs")
        except DataError as err:
            raise ValueError(str(err)) from None
        return [tuple(row) for row in table.itertuples(index=False)]


def _example(item: Any, where: str, fields: tuple[str, ...]) -> tuple[str, ...]:
    """One example's texts in ``fields`` order.

    Raises:
        ValueError: naming ``where`` and the field: a missing, unknown or non-string one.
    """
    if isinstance(item, str) and len(fields) == 1:
        item = {"text": item}
    if not isinstance(item, dict):
        shape = "{" + ", ".join(f'"{f}": "..."' for f in fields) + "}" + (" or a string" if len(fields) == 1 else "")
        raise ValueError(f"{where}: expected {shape}, got {type(item).__name__}")
    unknown = sorted(set(item) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; this model reads {list(fields)}")
    for field in fields:
        if field not in item:
            raise ValueError(f"{where}.{field}: missing; this model reads {list(fields)}")
        if not isinstance(item[field], str):
            raise ValueError(f"{where}.{field}: expected a string, got {type(item[field]).__name__}")
    return tuple(item[field] for field in fields)


class BodyLimit:
    """ASGI middleware: a body over ``max_bytes`` is refused with 413 before it is parsed, naming the limit."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send, int(length))
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                from fastapi import HTTPException

                raise HTTPException(413, self._message(received))
            return message

        return await self.app(scope, counted, send)

    def _message(self, size: int) -> str:
        return f"body: {size} bytes, over the limit of {self.max_bytes} bytes (--max-body-bytes)"

    async def _refuse(self, send, size: int) -> None:
        body = json.dumps({"error": self._message(size)}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class FormAPI(ls.LitAPI):
    """The model of ``form`` in ``folder``: each batch of requests tokenized with the folder's tokenizer
    (truncated to the model's length), sorted by length and run in chunks of at most ``max_batch_size`` examples,
    each padded to a multiple of ``pad_multiple`` tokens and filled up to a ``row_buckets`` size, so few input shapes
    occur. On a CUDA device (the engine's ``accelerator="cuda"``; the ``pytorch`` form only) the model runs in
    ``gpu_dtype``."""

    def __init__(self, form: str, folder: Path, pad_multiple: int, log_level: str, **batching):
        super().__init__(**batching)
        self.form, self.folder, self.pad_multiple, self.log_level = form, folder, pad_multiple, log_level

    def setup(self, device) -> None:
        from transformers import AutoConfig, AutoTokenizer

        from finetune.data.tokenization import position_limit, truncation_length
        from finetune.runtime import set_cpu_threads
        from finetune.tasks import Task

        logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")
        log.setLevel(self.log_level.upper())
        outlive_sigterm()
        set_cpu_threads(None)
        self.task = Task.load(self.folder)
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        self.max_length = truncation_length(self.tokenizer, None, position_limit(
            AutoConfig.from_pretrained(self.folder)))
        self.model = load_model(self.form, self.folder)
        self.model_device = device  # the engine's: "cpu" or "cuda:<n>"
        if device.startswith("cuda"):
            self.model.to(device, dtype=gpu_dtype())
        self._warm_up()

    def _warm_up(self) -> None:
        """One pass per input shape up to 128 tokens: each row bucket at each padded length (OpenVINO prepares each
        new shape on its first call, which costs several times a pass)."""
        for length in range(self.pad_multiple, min(self.max_length, 128) + 1, self.pad_multiple):
            for rows in row_buckets(self.max_batch_size):
                words = " ".join(["word"] * max(1, length // len(self.task.text_columns) - 2))
                self._logits([tuple([words] * len(self.task.text_columns))] * rows)

    def decode_request(self, request: PredictRequest) -> list[tuple[str, ...]]:
        return request.inputs

    def batch(self, inputs: list[list[tuple[str, ...]]]) -> list[list[tuple[str, ...]]]:
        return inputs

    def predict(self, requests: list[list[tuple[str, ...]]]) -> list[list[dict]]:
        rows = [row for request in requests for row in request]
        log.debug("batch: %d requests, %d examples", len(requests), len(rows))
        answers = iter(self._answers(self._logits(rows)))
        return [[next(answers) for _ in request] for request in requests]

    def unbatch(self, outputs: list[list[dict]]) -> list[list[dict]]:
        return outputs

    def encode_response(self, output: list[dict]) -> dict:
        return {"predictions": output}

    def _logits(self, rows: list[tuple[str, ...]]):
        """Logits ``[rows, num_labels]`` in ``rows``' order."""
        import torch

        encoded = self.tokenizer(*zip(*rows), truncation=True, max_length=self.max_length)
        order = np.argsort([len(ids) for ids in encoded["input_ids"]], kind="stable")
        logits = [None] * len(rows)
        with torch.inference_mode():
            for start in range(0, len(rows), self.max_batch_size):
                chunk = order[start:start + self.max_batch_size]
                filled = [*chunk, *[chunk[-1]] * (bucket(len(chunk), self.max_batch_size) - len(chunk))]
                batch = self.tokenizer.pad({key: [values[i] for i in filled] for key, values in encoded.items()},
                                           pad_to_multiple_of=self.pad_multiple, return_tensors="pt")
                batch = batch.to(self.model_device)
                out = self.model(**batch).logits.float()  # rows past the chunk's repeat its last: dropped
                for i, row in enumerate(chunk):
                    logits[row] = out[i].cpu()
        return torch.stack(logits)

    def _answers(self, logits) -> list[dict]:
        """Per row: the label and one probability per class, or the score (as ``tools.predict`` writes them)."""
        from finetune.evaluate.evaluation import with_predictions

        table = with_predictions(pd.DataFrame(index=range(len(logits))), logits, self.task)
        if self.task.is_regression:
            return [{"score": float(score)} for score in table["prediction"]]
        names = self.task.label_names
        probabilities = table[[f"probability_{name}" for name in names]].to_numpy()
        return [{"label": label, "probabilities": {name: round(float(v), 5) for name, v in zip(names, p)}}
                for label, p in zip(table["prediction"], probabilities)]


def row_buckets(max_rows: int) -> list[int]:
    """The batch sizes a forward pass is filled up to: 1, 2, 4, 8, then multiples of 8, and ``max_rows``."""
    sizes = [size for size in (1, 2, 4) if size < max_rows] + list(range(8, max_rows, 8))
    return [*sizes, max_rows]


def bucket(rows: int, max_rows: int) -> int:
    """The smallest of ``row_buckets(max_rows)`` that holds ``rows``."""
    return next(size for size in row_buckets(max_rows) if size >= rows)


def gpu_dtype():
    """bf16 where the GPU computes it, else fp16: the dtype of a model served on ``cuda``."""
    import torch

    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def load_model(form: str, folder: Path):
    """The classifier of ``form`` in ``folder`` (``finetune.export.forms.load_form``), in eval mode."""
    from finetune.export.forms import load_form

    return load_form(form, folder, folder.parent).eval()


def default_form(metrics: Path = EXPORT_METRICS) -> str:
    """``fastest_at_parity.batch_32`` of the export stage's metrics: the server batches concurrent requests.

    Raises:
        ExportError: the file is missing or names no such form; the message says how to make it or choose one.
    """
    if not metrics.is_file():
        raise ExportError(f"{metrics}: not found, so no fastest form to serve; run dvc repro export, or choose one "
                          f"with --form ({', '.join([PYTORCH, *FORMS])})")
    chosen = json.loads(metrics.read_text()).get("fastest_at_parity", {}).get("batch_32")
    if chosen is None:
        raise ExportError(f"{metrics}: no fastest_at_parity.batch_32; run dvc repro export, or choose --form")
    return chosen


def checked_folder(form: str, model_dir: Path, exported: Path) -> Path:
    """The folder of ``form``, once its task, tokenizer and model load here (a missing or incomplete folder stops
    start-up before the server starts).

    Raises:
        ExportError: one line naming the folder and the command that makes it.
    """
    from transformers import AutoTokenizer

    from finetune.export.forms import form_folder
    from finetune.tasks import Task

    make = "dvc repro train (or dvc pull)" if form == PYTORCH else "dvc repro export"
    folder = form_folder(form, model_dir, exported)
    if not folder.is_dir():
        raise ExportError(f"{folder}: not found; make it with {make}")
    try:
        Task.load(folder)
        AutoTokenizer.from_pretrained(folder)
        load_model(form, folder)  # weights and runtime load here, so a worker that can't start stops nothing
    except PipelineError as err:
        raise ExportError(f"{folder}: incomplete ({err}); make it again with {make}") from None
    except (OSError, ValueError) as err:
        raise ExportError(f"{folder}: incomplete ({str(err).splitlines()[0]}); make it again with {make}") from None
    return folder


def drain_on_sigterm(server) -> None:
    """SIGTERM to this process: the HTTP processes stop accepting and answer what they accepted (uvicorn's graceful
    shutdown) while the model worker still runs, then LitServe stops the rest and ``run`` returns (exit 0). During
    start-up, before anything is accepted, the process and its children stop at once (exit 0)."""
    main_pid = os.getpid()

    def drain() -> None:
        http = [p for p in multiprocessing.active_children() if p.name.startswith("LitServer-")]
        if not http:  # still starting: nothing was accepted
            for process in multiprocessing.active_children():
                process.kill()
            os._exit(0)
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

    def on_sigterm(signum, frame) -> None:
        if os.getpid() != main_pid:  # a helper forked from this process (LitServe's queue manager): stopped by it
            return
        log.info("SIGTERM: answering accepted requests, then stopping")
        threading.Thread(target=drain, name="drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)


def outlive_sigterm() -> None:
    """In a model worker: a SIGTERM sent to the whole process group (Ctrl-C's way, systemd's) leaves it running
    while its parent drains the HTTP processes, which then stops it; without its parent, it exits."""
    parent = os.getppid()

    def on_sigterm(signum, frame) -> None:
        if os.getppid() != parent:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)


def serve(form: str | None, model_dir: Path, exported: Path, host: str, port: int, max_batch_size: int,
          batch_timeout: float, max_examples: int, max_body_bytes: int, pad_multiple: int,
          log_level: str = "info", device: str = "cpu") -> None:
    """Serve ``form`` (None: ``default_form``) on ``device`` until SIGTERM or Ctrl-C.

    Raises:
        ExportError: the form is unknown, not exported or incomplete (one line naming its folder and the command
            that makes it), or metrics/export.json names none when ``form`` is None.
        PipelineError: ``device`` is ``cuda`` for a form other than ``pytorch``, or torch sees no CUDA GPU.
    """
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    from finetune.tasks import Task

    form = form or default_form()
    if device == "cuda":
        import torch

        if form != PYTORCH:
            raise PipelineError(f"--device cuda: serves the {PYTORCH} form only (the exported forms are CPU "
                                f"runtimes); add --form {PYTORCH}")
        if not torch.cuda.is_available():
            raise PipelineError(f"--device cuda: torch {torch.__version__} sees no CUDA GPU")
    folder = checked_folder(form, model_dir, exported)
    task = Task.load(folder)
    PredictRequest.limits = Limits(len(task.text_columns) == 2, max_examples, max_body_bytes)
    api = FormAPI(form, folder, pad_multiple, log_level, max_batch_size=max_batch_size, batch_timeout=batch_timeout)
    metadata = {"form": form, "device": device, "folder": str(folder), "task": task.name, "labels": task.label_names,
                "max_batch_size": max_batch_size, "batch_timeout_s": batch_timeout, "max_examples": max_examples,
                "max_body_bytes": max_body_bytes, "pad_to_multiple_of": pad_multiple}
    server = ls.LitServer(api, accelerator=device, devices=1, workers_per_device=1, timeout=60,
                          middlewares=[(BodyLimit, {"max_bytes": max_body_bytes})], model_metadata=metadata)

    async def refused(request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        if first.get("type") == "json_invalid":
            return JSONResponse({"error": f"body: not valid JSON ({first.get('ctx', {}).get('error', 'invalid')})"},
                                status_code=400)
        field = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
        message = first.get("msg", "").removeprefix("Value error, ")
        return JSONResponse({"error": message if message.startswith("inputs") or message.startswith("request")
                             else f"{field}: {message}"}, status_code=422)

    server.app.add_exception_handler(RequestValidationError, refused)
    drain_on_sigterm(server)
    log.info("Serving %s (%s) on %s, http://%s:%d/predict: batches of up to %d requests, waiting up to %g s", form,
             folder, device, host, port, max_batch_size, batch_timeout)
    server.run(host=host, port=port, log_level=log_level, generate_client_file=False, access_log=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", default=None, help=f"{PYTORCH} (--model, fp32) or a form of --exported: "
                        f"{', '.join(FORMS)}; default: fastest_at_parity.batch_32 of {EXPORT_METRICS}")
    parser.add_argument("--model", type=Path, default=Path("models/finetuned"), help="fine-tuned model folder")
    parser.add_argument("--exported", type=Path, default=Path("models/exported"),
                        help="a folder of exported forms: the export stage's, or the registry's text-classifier-served")
    parser.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1", "0.0.0.0", "::"])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch-size", type=positive_int, default=32,
                        help="requests the engine batches into one model call, and examples per forward pass")
    parser.add_argument("--batch-timeout", type=float, default=0.001,
                        help="seconds the engine waits for a batch to fill")
    parser.add_argument("--max-examples", type=positive_int, default=64, help="examples per request")
    parser.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="bytes per request body")
    parser.add_argument("--pad-to-multiple-of", type=positive_int, default=16,
                        help="pad each batch's length to a multiple of this (few input shapes)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: the pytorch form on the GPU in bf16 (fp16 where the GPU lacks bf16)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)

    def run() -> None:
        serve(args.form, args.model, args.exported, args.host, args.port, args.max_batch_size, args.batch_timeout,
              args.max_examples, args.max_body_bytes, args.pad_to_multiple_of, args.log_level, args.device)

    run_stage(run)


if __name__ == "__main__":
    main()
