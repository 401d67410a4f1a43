"""The machine under a benchmark and what a model costs on it: the machine's description, its dense matmul ceiling
(fp32, bf16 GFLOP/s; int8 GOP/s in ONNX Runtime), and a checkpoint's shape and training FLOPs, so that a measured
training speed can be given as a fraction of the ceiling."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from benchmarks.workspace import PRETRAINED_DIR
from finetune.hardware import cpu_bf16_flags, cpu_model, resolve_mixed_precision


def sync() -> None:
    """Wait for the GPU's queued work (if there is a GPU), so that a timer read next measures it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def machine() -> dict:
    """CPU model, torch threads, torch and Python versions, the CPU's bf16 flags, and the GPU's name if any."""
    info = {"cpu": cpu_model(), "cores": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(),
            "bf16_flags": " ".join(cpu_bf16_flags())}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


# ---------------------------------------------------------------- machine ceiling

def best_seconds(call, repeats: int) -> float:
    """The shortest of ``repeats`` timed calls of ``call()`` in seconds, after one untimed call (GPU work waited
    for)."""
    call()
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        call()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 10) -> float:
    """Dense ``[n, n] @ [n, n]`` throughput in GFLOP/s (2 n^3 FLOPs per product), best of ``repeats``."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / best_seconds(lambda: a @ b, repeats) / 1e9


def int8_gops(n: int = 2048, repeats: int = 10) -> float:
    """ONNX Runtime's ``MatMulInteger`` (uint8 x int8, int32 out) ``[n, n] @ [n, n]`` in GOP/s, best of
    ``repeats``: the int8 ceiling that dynamic quantization's matmuls run on."""
    # heavy: ONNX, for the serving benchmark only; the training ways import this module and report their peak RSS
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["c"])], "int8",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [n, n]),
                               helper.make_tensor_value_info("b", TensorProto.INT8, [n, n])],
                              [helper.make_tensor_value_info("c", TensorProto.INT32, [n, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"a": np.random.randint(0, 255, (n, n), dtype=np.uint8),
            "b": np.random.randint(-127, 127, (n, n), dtype=np.int8)}
    return 2 * n**3 / best_seconds(lambda: session.run(None, feed), repeats) / 1e9


def measure_ceiling() -> dict:
    """Dense matmul GFLOP/s in fp32, and in bf16 only where the hardware has bf16 (``resolve_mixed_precision``):
    a CPU without AVX512-BF16 emulates it, and one bf16 product of 2048² ran for minutes there."""
    has_bf16 = resolve_mixed_precision("auto") == "bf16"
    return {"fp32_gflops": matmul_gflops(torch.float32),
            "bf16_gflops": matmul_gflops(torch.bfloat16) if has_bf16 else None}


def ceiling_line(ceiling: dict) -> str:
    """The ceiling (``measure_ceiling``) as the sentence that ends RESULTS.md and CHECKPOINTS.md."""
    bf16 = f"{ceiling['bf16_gflops']:.0f} GFLOP/s" if ceiling["bf16_gflops"] else "not measured (no bf16 hardware)"
    return f"Matmul ceiling (2048², best of 10): fp32 {ceiling['fp32_gflops']:.0f} GFLOP/s, bf16 {bf16}."


# ---------------------------------------------------------------- a checkpoint's FLOPs

def checkpoint_shape(folder: Path = PRETRAINED_DIR) -> dict:
    """Model type, layers, hidden size, parameters and non-embedding parameters (those outside any
    ``*embeddings*`` module: a lookup costs no FLOPs) of the classifier on a checkpoint folder's encoder."""
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
    parameters = sum(p.numel() for p in model.parameters())
    embedding = sum(p.numel() for name, p in model.named_parameters() if "embeddings." in name)
    return {"model_type": config.model_type, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
            "parameters": parameters, "non_embedding_parameters": parameters - embedding}


def training_flops(real_tokens: int, mean_length: float, shape: dict | None = None) -> float:
    """Training FLOPs ≈ 6 × non-embedding parameters × real tokens + attention, for a checkpoint of ``shape``
    (``checkpoint_shape``; default models/pretrained's).

    Attention scores and the weighted sum cost 4 · seq · hidden FLOPs per token per layer forward, ×3 for
    forward + backward (Kaplan et al., 2020, https://arxiv.org/abs/2001.08361, table 1), with seq the mean
    real length.
    """
    shape = shape or checkpoint_shape()
    attention = 12 * shape["layers"] * mean_length * shape["hidden"] * real_tokens
    return 6 * shape["non_embedding_parameters"] * real_tokens + attention
