"""Load test of the HTTP server (``tools.serve``, LitServe) side by side with a user's baseline and with the bare
engine, on loopback: MRPC validation pairs, one per request, from 1, 8 and 32 concurrent clients (keep-alive
connections, each sending its next request when the last is answered), each level bounded in requests and seconds.

- baseline: what a user writes first, a FastAPI app whose endpoint calls ``pipeline("text-classification")`` in fp32
  on the fine-tuned model, one request at a time (the call blocks its event loop);
- bare: the engine's ceiling here, LitServe over the same form with the same batching and no checks, about 40 lines
  (``BareAPI``): tokenize the batch padded to a multiple of 16, run, softmax; what ``tools.serve`` loses to it is
  its own code's;
- engine: ``python -m tools.serve`` on the form.

Per server and level: requests/s, p50 and p99 latency, errors (a connection error, a timeout or a status other than
200), and accuracy and F1 from the answers' labels. ``--soak N`` then sends N requests from 32 clients to the engine
alone, zero errors expected. The servers run as subprocesses of this one, one at a time, and are stopped with SIGTERM
(their exit status is reported).

    python -m benchmarks.load                              # the served form (metrics/export.json), all three
    python -m benchmarks.load --form onnx-fp32 --requests 800 --soak 20000
    python -m benchmarks.load --model models/kept/mpnet-mrpc --exported models/kept/mpnet-mrpc-exported \\
        --out benchmarks/SERVE-LOAD-MPNET.md             # another fine-tuned model and its forms
    python -m benchmarks.load --form pytorch --device cuda   # on the GPU (the engine in bf16)

Writes benchmarks/SERVE-LOAD.md (``--out``): the table, the goals, CPU, command and date.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import date
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import litserve as ls
import numpy as np
import pandas as pd
import torch
import uvicorn
from datasets import load_from_disk
from fastapi import FastAPI
from sklearn.metrics import accuracy_score, f1_score
from transformers import AutoTokenizer, pipeline

from finetune.export.registry import form_folder, load_form
from finetune.export.speed import served_form
from finetune.hardware import cpu_model
from finetune.modeling import MeanPooledConfig  # noqa: F401  registers a mean-pooled head with the Auto classes (the baseline's pipeline)
from finetune.paths import Paths
from tools.serve import check_port

HERE = Path(__file__).parent
LOCAL_COPY = Path("../shared/datasets/glue/mrpc")
HOST = "127.0.0.1"
SERVERS = ("baseline", "bare", "engine")  # run in this order, one at a time
REQUEST_TIMEOUT_S = 30


def mrpc_validation() -> tuple[list[tuple[str, str]], list[int]]:
    """MRPC validation pairs and labels: data/raw (``dvc repro download``), else the local copy's parquet file."""
    raw = Paths().raw
    if (raw / "dataset_dict.json").is_file():
        rows = load_from_disk(str(raw))["validation"].to_pandas()
    else:
        rows = pd.read_parquet(next(LOCAL_COPY.glob("validation-*.parquet")))
    return list(zip(rows["sentence1"], rows["sentence2"])), rows["label"].astype(int).tolist()


def baseline_server(model_dir: Path, port: int, device: str = "cpu") -> None:
    """The user's baseline: FastAPI calling ``pipeline("text-classification")`` (fp32, on ``device``) per request,
    served by uvicorn on ``port``; answers ``{"predictions": [{"label": ..., "score": ...}]}``."""
    classify = pipeline("text-classification", model=str(model_dir), device=0 if device == "cuda" else -1)
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    @app.post("/predict")
    async def predict(body: dict) -> dict:
        return {"predictions": [classify(body["inputs"])]}

    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)


def bare_server(form: str, folder: Path, port: int, max_batch_size: int, batch_timeout: float,
                device: str = "cpu") -> None:
    """The bare engine: LitServe over ``form`` in ``folder`` with the engine's batching and no checks (``BareAPI``),
    on ``port``; answers ``{"predictions": [{"label": ...}]}``."""
    api = BareAPI(form, folder, max_batch_size=max_batch_size, batch_timeout=batch_timeout)
    server = ls.LitServer(api, accelerator=device, devices=1, workers_per_device=1, timeout=60)
    server.run(host=HOST, port=port, log_level="warning", generate_client_file=False, access_log=False)


class BareAPI(ls.LitAPI):
    """The form's runtime and tokenizer, loaded directly (the reference does not go through the project's
    ``Predictor``, on purpose): a batch of requests tokenized at once, padded to a multiple of 16, run, softmax."""

    def __init__(self, form: str, folder: Path, **batching):
        super().__init__(**batching)
        self.form, self.folder = form, folder

    def setup(self, device: str) -> None:
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        self.model, self.device = load_form(self.form, self.folder).to(device), device
        self.names = self.model.config.id2label

    def decode_request(self, request: dict) -> tuple[str, str]:
        return request["inputs"]["text"], request["inputs"]["text_pair"]

    def predict(self, pairs: list[tuple[str, str]]) -> list[dict]:
        texts, text_pairs = zip(*pairs)
        batch = self.tokenizer(list(texts), list(text_pairs), padding=True, truncation=True, pad_to_multiple_of=16,
                               return_tensors="pt").to(self.device)
        with torch.inference_mode():
            probabilities = self.model(**batch).logits.float().softmax(-1).cpu()
        return [{"label": self.names[int(p.argmax())], "probabilities": p.tolist()} for p in probabilities]

    def encode_response(self, output: dict) -> dict:
        return {"predictions": [output]}


def start_server(command: list[str], port: int, timeout: float = 300) -> subprocess.Popen:
    """Start a server command and wait for ``GET /health`` to answer 200.

    Raises:
        SystemExit: it exited or did not become ready within ``timeout`` seconds; its output's last lines.
    """
    check_port(HOST, port)  # a server left over on the port would answer in this one's place
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # its own process group: stop_server ends all of it
    # its output is read only if it fails to start: it logs warnings only (--log-level warning), far below a pipe's
    # buffer
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read()[-3000:]
            raise SystemExit(f"ERROR: {' '.join(command)} exited {process.returncode}:\n{output}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=1) as answer:
                if answer.status == 200:
                    return process
        except OSError:
            pass
        time.sleep(0.5)
    process.kill()
    raise SystemExit(f"ERROR: {' '.join(command)} not ready after {timeout} s")


def stop_server(process: subprocess.Popen) -> int:
    """SIGTERM to the server, then its exit status (killed after 60 s); whatever is left of its process group (the
    reference servers' LitServe and uvicorn children) is killed."""
    process.send_signal(signal.SIGTERM)
    try:
        status = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        status = process.wait()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return status


async def _client(port: int, bodies: list[bytes], counter, total: int, deadline: float, results: list) -> None:
    """Send requests one after another on one keep-alive connection until ``total`` are taken or ``deadline``;
    append ``(index, latency_s, status, body)`` per request (status 0: a connection error or timeout)."""
    reader = writer = None
    while time.monotonic() < deadline:
        index = next(counter)
        if index >= total:
            break
        body = bodies[index % len(bodies)]
        request = (f"POST /predict HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        begin = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(request)
            status, answer = await asyncio.wait_for(_read_response(reader), REQUEST_TIMEOUT_S)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            status, answer = 0, b""
            if writer is not None:
                writer.close()
            reader = writer = None
        results.append((index, time.perf_counter() - begin, status, answer))
    if writer is not None:
        writer.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length: its status and body."""
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def load_level(port: int, pairs, labels, clients: int, requests: int, seconds: float, names) -> dict:
    """``requests`` requests (at most ``seconds``) from ``clients`` concurrent clients: requests/s, p50 and p99 ms,
    errors, and accuracy and F1 of the answered labels."""
    bodies = [json.dumps({"inputs": {"text": a, "text_pair": b}}).encode() for a, b in pairs]
    results: list = []
    counter = itertools.count()

    async def run() -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(_client(port, bodies, counter, requests, deadline, results) for _ in range(clients)))

    begin = time.perf_counter()
    asyncio.run(run())
    wall = time.perf_counter() - begin
    ok = [(i, lat, json.loads(body)) for i, lat, status, body in results if status == 200]
    latencies = np.array([lat for _, lat, _ in ok]) * 1e3 if ok else np.array([np.nan])
    predicted = [names.index(answer["predictions"][0]["label"]) for _, _, answer in ok]
    gold = [labels[i % len(labels)] for i, _, _ in ok]
    return {"clients": clients, "requests": len(results), "seconds": round(wall, 2),
            "requests_per_s": round(len(ok) / wall, 1), "p50_ms": round(float(np.percentile(latencies, 50)), 2),
            "p99_ms": round(float(np.percentile(latencies, 99)), 2), "errors": len(results) - len(ok),
            "accuracy": round(accuracy_score(gold, predicted), 4) if ok else None,
            "f1": round(f1_score(gold, predicted), 4) if ok else None}


def run_server_levels(name: str, command: list[str], port: int, pairs, labels, levels, requests: int,
                      seconds: float, names, soak: int = 0) -> tuple[list[dict], dict | None, int]:
    """Every level against one server (a few untimed requests first), an optional soak, then SIGTERM: its rows,
    the soak's row and its exit status."""
    process = start_server(command, port)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below stops the server
    try:
        load_level(port, pairs[:16], labels[:16], 4, 16, 60, names)  # warm-up
        rows = []
        for clients in levels:
            row = {"server": name, **load_level(port, pairs, labels, clients, requests, seconds, names)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        soak_row = None
        if soak:
            soak_row = {"server": name, **load_level(port, pairs, labels, 32, soak, 3600, names)}
            print(json.dumps({"soak": soak_row}), flush=True)
    finally:
        status = stop_server(process)
    return rows, soak_row, status


def installed(package: str) -> str:
    """``package``'s version, or "not installed"."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def report(rows, soak_row, statuses: dict, form: str, folder: Path, goals: dict, settings: str, command: str,
           device: str = "cpu") -> str:
    """benchmarks/SERVE-LOAD.md's text."""
    gpu = ""
    if device == "cuda":
        gpu = f" GPU: {torch.cuda.get_device_name()} (the three servers on it)."
    lines = ["# Load test of the HTTP server", "",
             f"`{command}`, {date.today()}, CPU: {cpu_model()} ({os.cpu_count()} cores; clients and servers on the "
             f"same cores).{gpu} LitServe {installed('litserve')}, FastAPI {installed('fastapi')}, uvicorn "
             f"{installed('uvicorn')}, torch {installed('torch')}, onnxruntime {installed('onnxruntime')}, OpenVINO "
             f"{installed('openvino')}.", "",
             f"The form: {form} ({folder}). engine: `python -m tools.serve --form {form} {settings}"
             f"{' --device ' + device if device != 'cpu' else ''}`; bare: LitServe "
             f"over the same form with the same batching and no checks (`benchmarks.load.BareAPI`); baseline: "
             "FastAPI calling `pipeline(\"text-classification\")` fp32 on the fine-tuned model, one request at a "
             "time. MRPC validation pairs, one per request, keep-alive clients on loopback; one server at a time.", "",
             "| server | clients | requests | requests/s | p50 ms | p99 ms | errors | accuracy | F1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['server']} | {row['clients']} | {row['requests']} | {row['requests_per_s']} | "
                     f"{row['p50_ms']} | {row['p99_ms']} | {row['errors']} | {row['accuracy']} | {row['f1']} |")
    exits = ", ".join(f"{server} {status}" for server, status in statuses.items())
    lines += ["", f"Exit status after SIGTERM, once its levels ended: {exits}.", ""]
    if soak_row:
        lines += [f"Soak of the engine: {soak_row['requests']} requests from 32 clients in {soak_row['seconds']} s: "
                  f"{soak_row['requests_per_s']} requests/s, p50 {soak_row['p50_ms']} ms, p99 {soak_row['p99_ms']} "
                  f"ms, {soak_row['errors']} errors, accuracy {soak_row['accuracy']}, F1 {soak_row['f1']}.", ""]
    lines += ["Goals:", ""] + [f"- {goal}" for goal in goals.values()] + [""]
    return "\n".join(lines)


def goals_of(rows: list[dict], soak_row: dict | None) -> dict:
    """The goals, met or not, with the numbers: at 32 clients the engine serves at least 5x the baseline's and 0.9x
    the bare engine's requests/s; at 1 client its p99 is at most 1.2x the bare engine's; the soak has no error."""
    by = {(r["server"], r["clients"]): r for r in rows}
    out = {}
    engine32 = by.get(("engine", 32))
    for other, goal, name in (("baseline", 5, "the baseline's"), ("bare", 0.9, "the bare engine's")):
        if engine32 and (row := by.get((other, 32))):
            ratio = engine32["requests_per_s"] / row["requests_per_s"]
            out[f"{other} 32"] = (f"32 clients: {ratio:.2f}x {name} requests/s (goal {goal}x): "
                                  f"{'met' if ratio >= goal else 'missed'}")
    engine1, bare1 = by.get(("engine", 1)), by.get(("bare", 1))
    if engine1 and bare1:
        ratio = engine1["p99_ms"] / bare1["p99_ms"]
        out["p99 1"] = (f"1 client: p99 {engine1['p99_ms']} ms, {ratio:.2f}x the bare engine's {bare1['p99_ms']} ms "
                        f"(goal at most 1.2x): {'met' if ratio <= 1.2 else 'missed'}")
    if soak_row:
        out["soak"] = (f"soak: {soak_row['errors']} errors in {soak_row['requests']} requests (goal 0): "
                       f"{'met' if soak_row['errors'] == 0 else 'missed'}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", default=None, help="the served form (default: metrics/export.json's choice)")
    parser.add_argument("--model", type=Path, default=Paths().finetuned, help="the fine-tuned model folder")
    parser.add_argument("--exported", type=Path, default=Paths().exported, help="its folder of exported forms")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=816, help="requests per level (at most)")
    parser.add_argument("--seconds", type=float, default=60, help="seconds per level (at most)")
    parser.add_argument("--soak", type=int, default=0, help="then this many requests from 32 clients to the engine")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-timeout", type=float, default=0.001)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: the engine and the bare engine serve --form pytorch on the GPU in bf16, the "
                             "baseline's pipeline() runs there in fp32")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--run", choices=list(SERVERS)[:2], help=argparse.SUPPRESS)  # a reference server's process
    parser.add_argument("--out", type=Path, default=HERE / "SERVE-LOAD.md")
    args = parser.parse_args(argv)
    form = args.form or served_form()
    folder = form_folder(form, args.model, args.exported)
    if args.run == "baseline":
        return baseline_server(args.model, args.port, args.device)
    if args.run == "bare":
        return bare_server(form, folder, args.port, args.max_batch_size, args.batch_timeout, args.device)

    pairs, labels = mrpc_validation()
    names = json.loads((args.model / "task.json").read_text())["label_names"]
    settings = f"--max-batch-size {args.max_batch_size} --batch-timeout {args.batch_timeout}"
    given = ["--form", form, "--model", str(args.model), "--exported", str(args.exported), "--device", args.device]
    commands = {server: [sys.executable, "-m", "benchmarks.load", "--run", server, *given, *settings.split()]
                for server in ("baseline", "bare")}
    commands["engine"] = [sys.executable, "-m", "tools.serve", *given, *settings.split(), "--log-level", "warning"]
    rows, soak_row, statuses = [], None, {}
    for server in args.servers:
        port = args.port + list(SERVERS).index(server)
        server_rows, soak, statuses[server] = run_server_levels(
            server, commands[server] + ["--port", str(port)], port, pairs, labels, args.clients, args.requests,
            args.seconds, names, args.soak if server == "engine" else 0)
        rows += server_rows
        soak_row = soak or soak_row
    goals = goals_of(rows, soak_row)
    command = "python -m benchmarks.load " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.write_text(report(rows, soak_row, statuses, form, folder, goals, settings, command.strip(), args.device))
    print("\n".join(goals.values()))
    print(f"Wrote {args.out}")


if __name__ == "__main__":
    main()
