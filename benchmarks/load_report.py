"""The report of ``benchmarks.load`` (benchmarks/SERVE-LOAD.md): each level's median over the rounds, the headline
ratios, the goals, where a request's CPU goes, the servers against the form in-process, the agreement with the
evaluate stage, and the machine, commands, date and commit it was measured with.
"""

from __future__ import annotations

import statistics
import subprocess
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

from benchmarks.load_agreement import Agreement
from benchmarks.load_processes import ROLES
from benchmarks.machine import machine
from finetune.hardware import cpu_info
from finetune.runtime import markdown_table

NAMES = {"baseline": "baseline", "bare": "bare engine", "engine": "tools.serve"}
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")  # what the forms' kernels use
GOAL_BASELINE, GOAL_BARE = 5.0, 1.0  # at the top level, tools.serve's requests/s over the baseline's, the bare's


def medians(runs: list[dict], server: str) -> dict[int, dict]:
    """Per level (clients) of ``server``'s runs: the median over its rounds of requests/s, p50 and p99 ms and CPU ms
    per request by role; errors and requests summed; accuracy and F1 of the first round; ``each``: every round's
    requests/s."""
    levels: dict[int, list[dict]] = {}
    for run in (r for r in runs if r["server"] == server):
        for row in run["levels"]:
            levels.setdefault(row["clients"], []).append(row)
    out = {}
    for clients, rows in levels.items():
        out[clients] = {"clients": clients, "each": [r["requests_per_s"] for r in rows],
                        **{k: round(statistics.median(r[k] for r in rows), 2)
                           for k in ("requests_per_s", "p50_ms", "p99_ms")},
                        **{k: sum(r[k] for r in rows) for k in ("errors", "requests")},
                        "accuracy": rows[0]["accuracy"], "f1": rows[0]["f1"]}
        cpu = [r["cpu"] for r in rows if r.get("cpu")]
        if cpu:
            out[clients]["cpu"] = {role: round(statistics.median(c.get(role, 0.0) for c in cpu), 3)
                                   for role in ROLES if any(role in c for c in cpu)}
    return out


def headline(by: dict[str, dict[int, dict]]) -> list[str]:
    """The report's lines: at the top level, tools.serve's requests/s over the baseline's and the bare engine's;
    the p99 at 1 client of tools.serve and the bare engine (where those servers ran)."""
    engine, lines = by.get("engine", {}), []
    if not engine:
        return lines
    top = max(engine)
    for other, name in (("baseline", "the baseline"), ("bare", "the bare engine")):
        if top in by.get(other, {}):
            lines.append(f"{top} clients: {engine[top]['requests_per_s'] / by[other][top]['requests_per_s']:.2f}x "
                         f"{name}")
    if 1 in engine and 1 in by.get("bare", {}):
        lines.append(f"1 client p99: tools.serve {engine[1]['p99_ms']} ms, the bare engine {by['bare'][1]['p99_ms']} "
                     "ms")
    return lines


def goals(by: dict[str, dict[int, dict]], agreement: Agreement | None, soak: dict | None) -> list[str]:
    """The goals, each met or missed: at the top level at least ``GOAL_BASELINE``x the baseline's and ``GOAL_BARE``x
    the bare engine's requests/s; at 1 client a p99 at most the bare engine's; the served labels within what the
    precisions allow; a soak without an error."""
    engine, out = by.get("engine", {}), []
    verdict = {True: "met", False: "missed", None: "no bound known"}
    top = max(engine) if engine else None
    for other, goal, name in (("baseline", GOAL_BASELINE, "the baseline's"), ("bare", GOAL_BARE, "the bare engine's")):
        if top in by.get(other, {}):
            ratio = engine[top]["requests_per_s"] / by[other][top]["requests_per_s"]
            out.append(f"{top} clients: at least {goal:g}x {name} requests/s: {verdict[ratio >= goal]}")
    if 1 in engine and 1 in by.get("bare", {}):
        within = engine[1]["p99_ms"] <= by["bare"][1]["p99_ms"]
        out.append(f"1 client: a p99 at most the bare engine's: {verdict[within]}")
    if agreement is not None:
        allowed = "every label the same" if agreement.allowed == 0 else f"at most {agreement.allowed} rows differ"
        out.append(f"served as evaluated ({allowed}): {verdict[agreement.met]}")
    if soak:
        out.append(f"soak: no error in {soak['requests']} requests: {verdict[soak['errors'] == 0]}")
    return out


def installed(package: str) -> str:
    """``package``'s version, or "not installed"."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def commit() -> str:
    """The working tree's commit, ``(with uncommitted changes)`` where tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "no git commit"
    return f"{head}{' (with uncommitted changes)' if dirty else ''}"


def machine_line() -> str:
    """CPU model, cores and the flags the forms' kernels use; the GPU where torch sees one."""
    info, flags = machine(), set(cpu_info().get("flags", "").split())
    present = " ".join(f for f in CPU_FLAGS if f in flags) or "none of " + " ".join(CPU_FLAGS)
    gpu = f"; GPU: {info['gpu']}" if "gpu" in info else ""
    return f"CPU: {info['cpu']} ({info['cores']} threads; flags: {present}){gpu}"


def report(record: dict) -> str:
    """benchmarks/SERVE-LOAD.md's text from ``record`` (``benchmarks.load.main``'s)."""
    runs, agreement = record["runs"], record["agreement"]
    by = {server: medians(runs, server) for server in NAMES}
    lines = ["# Load test of the HTTP server", "",
             f"`{record['command']}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit()}. "
             f"{machine_line()}; the clients and the servers on the same cores. LitServe {installed('litserve')}, "
             f"FastAPI {installed('fastapi')}, uvicorn {installed('uvicorn')}, aiohttp {installed('aiohttp')}, torch "
             f"{installed('torch')}, onnxruntime {installed('onnxruntime')}, OpenVINO {installed('openvino')}.", "",
             f"The form: {record['form']} ({record['folder']}), served in {record['served_in']}. Each request one "
             f"validation example of {record['rows']} in turn, on a new connection; each level at most "
             f"{record['requests']} requests and {record['seconds']:g} s. tools.serve and the bare engine alternate in "
             f"{record['rounds']} rounds in ABBA order (tools.serve first in odd rounds), the baseline runs once, "
             "last; each number of a server run more than once is the median of its rounds. The commands (each also "
             "given `--port`):", ""]
    lines += [f"- {NAMES[server]}: `{command}`" for server, command in record["commands"].items()]
    lines += [""] + [part for line in headline(by) for part in (line, "")]
    if agreement is not None:
        lines += [agreement.line(), ""]
    lines += ["## Goals", ""] + [f"- {goal}" for goal in goals(by, agreement, record["soak"])] + [""]
    lines += ["## Requests", "", markdown_table(
        ["server", "clients", "requests/s", "each round", "p50 ms", "p99 ms", "errors", "accuracy", "F1"],
        [[NAMES[server], row["clients"], row["requests_per_s"], " / ".join(map(str, row["each"])), row["p50_ms"],
          row["p99_ms"], row["errors"], row["accuracy"], row["f1"]]
         for server in NAMES for row in sorted(by[server].values(), key=lambda r: r["clients"])])]
    cpu_rows = [(server, top["cpu"]) for server in NAMES
                if by[server] and "cpu" in (top := by[server][max(by[server])])]
    if cpu_rows:
        roles = [role for role in ROLES if any(cpu.get(role, 0) > 0 for _, cpu in cpu_rows)]
        clients = max(max(by[server]) for server, _ in cpu_rows)
        lines += ["## Where a request's CPU goes", "",
                  f"CPU milliseconds (user + system, psutil) per request answered at {clients} "
                  "clients, by process role; the load generator is the benchmark's own process (aiohttp).", "",
                  markdown_table(["server", *roles, "server total"],
                                 [[NAMES[server], *(cpu.get(role, "") for role in roles),
                                   round(sum(v for r, v in cpu.items() if r != "load generator"), 3)]
                                  for server, cpu in cpu_rows])]
    lines += ["## Against the form in-process", "", record["in_process"], ""]
    if agreement is not None:
        why = record["agreement_why"]
        lines += ["## Served against evaluated", "", f"{agreement.line()}. {why[:1].upper()}{why[1:]}. The largest "
                  f"difference of a class probability: {agreement.max_probability_diff}."]
        if agreement.differing:
            shown = ", ".join(map(str, agreement.differing[:20]))
            more = f" and {len(agreement.differing) - 20} more" if len(agreement.differing) > 20 else ""
            loud = "**MISMATCH**: " if agreement.met is False else ""
            lines.append(f"{loud}the rows (idx) whose served label differs: {shown}{more}.")
        lines.append("")
    else:
        lines += ["## Served against evaluated", "", f"{record['agreement_why']}.", ""]
    exits = ", ".join(f"{NAMES[r['server']]} {r['status']}" for r in runs)
    lines += [f"Exit status after SIGTERM, in the order run: {exits}.", ""]
    if soak := record["soak"]:
        lines += [f"Soak of tools.serve: {soak['requests']} requests from 32 clients in {soak['seconds']} s: "
                  f"{soak['requests_per_s']} requests/s, p50 {soak['p50_ms']} ms, p99 {soak['p99_ms']} ms, "
                  f"{soak['errors']} errors, accuracy {soak['accuracy']}, F1 {soak['f1']}.", ""]
    return "\n".join(lines)
