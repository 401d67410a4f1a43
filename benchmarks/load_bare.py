"""The bare engine of ``benchmarks.load``: LitServe over a served form with the batching ``tools.serve`` uses and no
checks, the engine's ceiling on the machine. The form's runtime and tokenizer are loaded directly, not through the
project's ``Predictor``, on purpose: what ``tools.serve`` loses to it is its own code's.

    python -m benchmarks.load_bare --form openvino-int8 --folder models/exported/openvino-int8 --port 8766

``POST /predict`` takes ``{"inputs": {"text": ..., "text_pair": ...}}`` (``text_pair`` for a pair task only) and
answers ``{"predictions": [{"label": name, "probabilities": [p, ...]}]}``; ``GET /health`` answers 200 once the model
is loaded.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import litserve as ls
import torch
from litserve.loops import BatchedLoop
from transformers import AutoTokenizer

from finetune.export.registry import load_form
from finetune.hardware import serving_dtype

HOST = "127.0.0.1"


class BareAPI(ls.LitAPI):
    """``form`` in ``folder``: a batch of requests tokenized at once (truncated at the tokenizer's
    ``model_max_length``), padded to a multiple of 16 tokens, run (on a GPU in bf16 or fp16), softmax."""

    def __init__(self, form: str, folder: Path, **batching):
        # the batched loop at every --max-batch-size: LitServe's default for 1 (its SingleLoop) skips batch and
        # unbatch and hands predict one request instead of a list of them
        super().__init__(loop=BatchedLoop(), **batching)
        self.form, self.folder = form, folder

    def setup(self, device: str) -> None:
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        self.model = load_form(self.form, self.folder).to(device, dtype=serving_dtype(device))  # as tools.serve
        self.device = device
        self.names = self.model.config.id2label

    def decode_request(self, request: dict) -> tuple[str, str | None]:
        return request["inputs"]["text"], request["inputs"].get("text_pair")

    def predict(self, examples: list[tuple[str, str | None]]) -> list[dict]:
        texts, text_pairs = zip(*examples)
        batch = self.tokenizer(list(texts), None if text_pairs[0] is None else list(text_pairs), padding=True,
                               truncation=True, pad_to_multiple_of=16, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            probabilities = self.model(**batch).logits.float().softmax(-1).cpu()
        return [{"label": self.names[int(p.argmax())], "probabilities": p.tolist()} for p in probabilities]

    def encode_response(self, output: dict) -> dict:
        return {"predictions": [output]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", required=True, help="the form's name in the registry (pytorch: a fine-tuned model)")
    parser.add_argument("--folder", type=Path, required=True, help="the form's folder")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-timeout", type=float, default=0.001)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args(argv)
    api = BareAPI(args.form, args.folder, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout)
    server = ls.LitServer(api, accelerator=args.device, devices=1, workers_per_device=1, timeout=60)
    server.run(host=HOST, port=args.port, log_level="warning", generate_client_file=False, access_log=False)


if __name__ == "__main__":
    main()
