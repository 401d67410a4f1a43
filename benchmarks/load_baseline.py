"""The baseline of ``benchmarks.load``: what a user writes first, a FastAPI app whose endpoint calls
``pipeline("text-classification")`` in fp32 on the fine-tuned model, one request at a time (the call blocks its event
loop), served by uvicorn in one process.

    python -m benchmarks.load_baseline --model models/finetuned --port 8767

``POST /predict`` takes ``{"inputs": {"text": ..., "text_pair": ...}}`` and answers
``{"predictions": [{"label": name, "score": p}]}``; ``GET /health`` answers 200 once the model is loaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from transformers import pipeline

from finetune.modeling import MeanPooledConfig  # noqa: F401  registers a mean-pooled head with the Auto classes

HOST = "127.0.0.1"


def app(model: Path, device: str = "cpu") -> FastAPI:
    """The app over the fine-tuned model folder ``model``, its pipeline on ``device`` (fp32)."""
    classify = pipeline("text-classification", model=str(model), device=0 if device == "cuda" else -1)
    served = FastAPI()

    @served.get("/health")
    async def health() -> dict:
        return {"ok": True}

    @served.post("/predict")
    async def predict(body: dict) -> dict:
        return {"predictions": [classify(body["inputs"])]}

    return served


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/finetuned"), help="the fine-tuned model folder")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--port", type=int, default=8767)
    args = parser.parse_args(argv)
    uvicorn.run(app(args.model, args.device), host=HOST, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
