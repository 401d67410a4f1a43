"""The load generator of ``benchmarks.load``: concurrent clients on aiohttp's client, each sending one example per
request on a new connection (``force_close``) and its next request when the last is answered, on loopback. The
validation rows it sends, and what one level of load measures.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd
from datasets import load_from_disk
from sklearn.metrics import accuracy_score, f1_score

from finetune.paths import Paths
from finetune.tasks import Task

HOST = "127.0.0.1"
REQUEST_TIMEOUT_S = 30
LOCAL_COPY = Path("../shared/datasets/glue/mrpc")  # MRPC's validation parquet where the project has no data/raw


@dataclass(frozen=True)
class Rows:
    """The validation rows sent: ``bodies`` (one ``POST /predict`` body per row), ``labels`` (gold class ids), the
    task's ``names``, and ``evaluated``, the evaluate stage's predictions of the same rows in the same order
    (data/predictions/validation.csv; None where the project has none)."""

    bodies: list[bytes]
    labels: list[int]
    names: list[str]
    evaluated: pd.DataFrame | None


def validation_rows(project: Path, task: Task) -> Rows:
    """The validation split of ``project`` for ``task``: the evaluate stage's data/predictions/validation.csv (its
    texts, gold labels and predictions), else data/raw (``dvc repro download``), else the local copy of MRPC.

    Raises:
        SystemExit: none of them is there.
    """
    paths = Paths(project)
    evaluated, csv = None, paths.predictions / "validation.csv"
    if csv.is_file():  # texts as written: "NA" or "null" stay text
        table = evaluated = pd.read_csv(csv, keep_default_na=False, dtype={c: str for c in task.text_columns})
        labels = [task.label_names.index(name) for name in table["label"]]
    elif (paths.raw / "dataset_dict.json").is_file():
        table = load_from_disk(str(paths.raw))["validation"].to_pandas()
        labels = table["label"].astype(int).tolist()
    elif any(LOCAL_COPY.glob("validation-*.parquet")):
        table = pd.read_parquet(next(LOCAL_COPY.glob("validation-*.parquet")))
        labels = table["label"].astype(int).tolist()
    else:
        raise SystemExit(f"ERROR: no validation rows: none of {csv}, {paths.raw}, {LOCAL_COPY}; run dvc repro "
                         f"evaluate in {project}")
    fields = ("text", "text_pair")[:len(task.text_columns)]
    bodies = [json.dumps({"inputs": dict(zip(fields, texts))}).encode()
              for texts in zip(*(table[column] for column in task.text_columns))]
    return Rows(bodies, labels, list(task.label_names), evaluated)


async def _client(session: aiohttp.ClientSession, url: str, bodies: list[bytes], counter, total: int,
                  deadline: float, results: list) -> None:
    """Send requests one after another until ``total`` are taken or ``deadline``; append ``(index, latency_s,
    status, body)`` per request (status 0: a connection error or a timeout)."""
    while time.monotonic() < deadline:
        index = next(counter)
        if index >= total:
            break
        begin = time.perf_counter()
        try:
            async with session.post(url, data=bodies[index % len(bodies)],
                                    headers={"Content-Type": "application/json"}) as response:
                status, body = response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            status, body = 0, b""
        results.append((index, time.perf_counter() - begin, status, body))


def send(port: int, bodies: list[bytes], clients: int, requests: int, seconds: float) -> tuple[list, float]:
    """``requests`` requests (request ``i`` sends ``bodies[i % len(bodies)]``) from ``clients`` concurrent clients,
    stopped after ``seconds``: ``(results, wall seconds)``, a result per request sent, as ``_client`` appends it."""
    results: list = []

    async def run() -> None:
        connector = aiohttp.TCPConnector(force_close=True, limit=0)  # a new connection per request, no pool cap
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            counter, deadline = itertools.count(), time.monotonic() + seconds
            url = f"http://{HOST}:{port}/predict"
            await asyncio.gather(*(_client(session, url, bodies, counter, requests, deadline, results)
                                   for _ in range(clients)))

    begin = time.perf_counter()
    asyncio.run(run())
    return results, time.perf_counter() - begin


def level(port: int, rows: Rows, clients: int, requests: int, seconds: float) -> dict:
    """One level of load (``send``): requests/s answered, p50 and p99 ms, errors (a connection error, a timeout or
    a status other than 200), and accuracy and F1 (binary: of class 1; else macro) of the answered labels."""
    results, wall = send(port, rows.bodies, clients, requests, seconds)
    ok = [(i, latency, json.loads(body)) for i, latency, status, body in results if status == 200]
    latencies = np.array([latency for _, latency, _ in ok]) * 1e3 if ok else np.array([np.nan])
    predicted = [rows.names.index(answer["predictions"][0]["label"]) for _, _, answer in ok]
    gold = [rows.labels[i % len(rows.labels)] for i, _, _ in ok]
    average = "binary" if len(rows.names) == 2 else "macro"
    return {"clients": clients, "requests": len(results), "seconds": round(wall, 2),
            "requests_per_s": round(len(ok) / wall, 1), "p50_ms": round(float(np.percentile(latencies, 50)), 2),
            "p99_ms": round(float(np.percentile(latencies, 99)), 2), "errors": len(results) - len(ok),
            "accuracy": round(accuracy_score(gold, predicted), 4) if ok else None,
            "f1": round(f1_score(gold, predicted, average=average), 4) if ok else None}


def answers(port: int, rows: Rows, clients: int = 8) -> list[dict | None]:
    """Every row sent once, one per request, from ``clients`` clients: per row in order, the answer's first
    prediction (``{"label", "probabilities"}``), or None where the request failed."""
    results, _ = send(port, rows.bodies, clients, len(rows.bodies), 3600)
    got: list[dict | None] = [None] * len(rows.bodies)
    for index, _, status, body in results:
        if status == 200:
            got[index] = json.loads(body)["predictions"][0]
    return got
