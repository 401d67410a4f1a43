"""What a ``tools.serve`` request goes through: the request model pydantic checks in the HTTP process
(``PredictRequest``; ``refusal`` writes its error), and the model worker's ``LitAPI`` (``FormAPI``), which scores
each batch of requests with ``finetune.inference.predictor.Predictor`` and, when a batch fails, each request alone, so
one request never fails another."""

import logging
import os
import signal
import warnings
from pathlib import Path
from typing import Annotated, ClassVar

import litserve as ls
from fastapi.responses import JSONResponse
from litserve.loops import BatchedLoop
from pydantic import AfterValidator, BaseModel, ConfigDict, field_validator

from finetune.data.batches import row_buckets
from finetune.errors import PipelineError, field_error, first_line
from finetune.export.registry import open_form
from finetune.hardware import serving_dtype
from tools.serve_lifecycle import outlive_sigterm

log = logging.getLogger("tools.serve")
FIELDS = ("text", "text_pair")  # an example's fields, in the order of its texts


def _text(text: str) -> str:
    """A text the tokenizer can take: not empty or only whitespace, and valid Unicode (no lone surrogate, which
    JSON's ``\\ud83d`` escapes can carry)."""
    if not text.strip():
        raise ValueError("empty text (empty or only whitespace)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"not valid Unicode text ({err.reason}: {text[err.start:err.end]!r} at character "
                         f"{err.start})") from None
    return text


class Example(BaseModel):
    """One example: ``text`` and, for a pair task, ``text_pair`` (``pipeline("text-classification")``'s names)."""

    model_config = ConfigDict(extra="forbid")
    text: Annotated[str, AfterValidator(_text)]
    text_pair: Annotated[str, AfterValidator(_text)] | None = None


class PredictRequest(BaseModel):
    """A ``POST /predict`` body, checked in the HTTP process: one example or a list of 1 to ``max_examples``, each
    with the fields the task reads (``pair``); a single-text task also takes a string. Both class settings are set by
    ``tools.serve`` before the HTTP processes start.

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
            raise ValueError(f"{len(items)} examples; give one example or a list of 1 to {cls.max_examples} per "
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


def refusal(errors: list[dict]) -> tuple[int, str]:
    """The status and one-line ``error`` of a request pydantic refused: its first error, the field written as
    ``inputs[1].text_pair`` (``finetune.errors.field_error``)."""
    first = errors[0]
    if first.get("type") == "json_invalid":
        return 400, f"body: not valid JSON ({first.get('ctx', {}).get('error', 'invalid')})"
    if len(first.get("loc", ())) < 2:
        return 422, "body: expected a JSON object such as {\"inputs\": ...}, sent as Content-Type: application/json"
    return 422, field_error(first, skip=1)  # its loc starts with "body"


Request = list[tuple[str, ...]]  # a request's examples, each its texts in FIELDS order


class FormAPI(ls.LitAPI):
    """The model of ``form`` in ``folder`` behind LitServe: each batch of requests scored by ``Predictor.logits`` in
    chunks of at most ``max_batch_size`` examples, padded to a multiple of ``pad_multiple`` tokens and, with
    ``fill_rows``, filled up to a ``row_buckets`` size, so a runtime that compiles each shape meets few of them;
    ``tokenizer_threads``: the tokenizers library's thread pool on (``TOKENIZERS_PARALLELISM``) in the model worker.
    ``open_options`` go to ``open_form`` (truncation, CPU threads, the loader's options). On ``cuda`` (the
    ``pytorch`` form only) the model runs in bf16, fp16 where the GPU lacks bf16."""

    def __init__(self, form: str, folder: Path, open_options: dict, pad_multiple: int, fill_rows: bool,
                 tokenizer_threads: bool, log_level: str, **batching):
        # the batched loop at every --max-batch-size: LitServe's default for 1 (its SingleLoop) skips batch and
        # unbatch and hands predict one request instead of a list of them; so its warning that batch and unbatch
        # are defined with a max_batch_size of 1 does not apply
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The LitServer has both batch and unbatch", UserWarning)
            super().__init__(loop=BatchedLoop(), **batching)
        self.form, self.folder, self.open_options, self.log_level = form, folder, open_options, log_level
        self.pad_multiple, self.fill_rows, self.tokenizer_threads = pad_multiple, fill_rows, tokenizer_threads

    def setup(self, device: str) -> None:
        logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")
        log.setLevel(self.log_level.upper())
        outlive_sigterm()
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if self.tokenizer_threads else "false"  # read at each call
        dtype = serving_dtype(device)
        try:
            self.predictor = open_form(self.folder, self.form, device=device, dtype=dtype, **self.open_options)
            self.warm_up()
        except Exception as err:  # at start-up, or restarting after a crash: the server stops, exit status 1
            log.error("%s; stopping the server", err if isinstance(err, PipelineError) else
                      f"{self.folder}: the {self.form} form failed to load or run ({first_line(err, 200)})")
            os.kill(os.getppid(), signal.SIGUSR1)
            raise SystemExit(1) from None

    def warm_up(self) -> None:
        """One pass per input shape (OpenVINO compiles each): each length, a multiple of ``pad_multiple`` up to 128
        tokens (at most the truncation), at each row count of ``row_buckets``."""
        columns = len(self.predictor.task.text_columns)
        for length in range(self.pad_multiple, min(self.predictor.max_length, 128) + 1, self.pad_multiple):
            words = " ".join(["word"] * max(1, length // columns - 2))
            for rows in row_buckets(self.max_batch_size):
                self.score([[(words,) * columns] * rows])

    def decode_request(self, request: PredictRequest) -> Request:
        return [(e.text,) if e.text_pair is None else (e.text, e.text_pair) for e in request.inputs]

    def batch(self, inputs: list[Request]) -> list[Request]:
        return inputs

    def predict(self, requests: list[Request]) -> list[list[dict] | JSONResponse]:
        """Each request's answers; when the batch fails, each request scored alone, and one that fails alone gets
        its error (``failure``) while the others get their answers."""
        try:
            return self.score(requests)
        except Exception as err:  # whatever the model raised: only the request that causes it gets an error
            if len(requests) == 1:
                return [self.failure(requests[0], err)]
            log.warning("A batch of %d requests failed (%s); scoring each alone", len(requests), first_line(err, 200))
            return [self.alone(request) for request in requests]

    def score(self, requests: list[Request]) -> list[list[dict]]:
        """The answers of every request of a batch, scored together."""
        rows = [row for request in requests for row in request]
        log.debug("batch: %d requests, %d examples", len(requests), len(rows))
        answers = iter(self.predictor.answers(self.predictor.logits(
            rows, batch_size=self.max_batch_size, pad_to_multiple_of=self.pad_multiple, fill_rows=self.fill_rows)))
        return [[next(answers) for _ in request] for request in requests]

    def alone(self, request: Request) -> list[dict] | JSONResponse:
        try:
            return self.score([request])[0]
        except Exception as err:  # as in predict
            return self.failure(request, err)

    def failure(self, request: Request, err: Exception) -> JSONResponse:
        """The answer to a request the model failed on: a 422 naming the first text the tokenizer can't take
        (``inputs[2].text_pair``), else a 500 (logged with its traceback)."""
        for i, example in enumerate(request):
            for field, text in zip(FIELDS, example):
                try:
                    self.predictor.encode([(text,)])
                except Exception as refused:  # the tokenizer's own error, whatever its type
                    reason = first_line(refused, 200)
                    log.warning("inputs[%d].%s: refused by the tokenizer (%s)", i, field, reason)
                    return JSONResponse({"error": f"inputs[{i}].{field}: the tokenizer can't take this text "
                                                  f"({reason})"}, status_code=422)
        log.error("The model failed on a request of %d examples", len(request), exc_info=err)
        return JSONResponse({"error": f"the model failed on this request ({first_line(err, 200)}); the server "
                                      "logged it"}, status_code=500)

    def unbatch(self, outputs: list[list[dict] | JSONResponse]) -> list[list[dict] | JSONResponse]:
        return outputs

    def encode_response(self, output: list[dict] | JSONResponse) -> dict:
        # a JSONResponse (one request's error) passes through LitServe and FastAPI as it is
        return output if isinstance(output, JSONResponse) else {"predictions": output}
