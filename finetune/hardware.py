"""What a run's numbers depend on besides params, data, code and packages: the processor, its instructions, the
threads and the precision, as metrics/train.json records them (docs/reproducibility.md).
"""

from __future__ import annotations

from pathlib import Path

import torch


def cpu_info() -> dict:
    """The first processor's fields of ``/proc/cpuinfo`` (``vendor_id``, ``model name``, ``cpu family``, ``model``,
    ``flags``, ...) as strings; empty when the file can't be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (e.g. ``AMD EPYC``), or ``unknown CPU``."""
    return cpu_info().get("model name") or "unknown CPU"


def cpu_bf16_flags() -> list[str]:
    """The CPU's bf16 instruction sets among AVX512-BF16 and AMX-BF16 (``/proc/cpuinfo`` flags; empty when it has
    none or the file can't be read): with none, bf16 is emulated and slower than fp32."""
    flags = set(cpu_info().get("flags", "").split())
    return [flag for flag in ("avx512_bf16", "amx_bf16") if flag in flags]


def resolve_mixed_precision(choice: str) -> str:
    """Accelerate's ``mixed_precision`` for ``choice``: 'auto' is 'bf16' on a GPU with bf16 or a CPU with
    AVX512-BF16 or AMX-BF16, 'fp16' on another GPU, else 'no'; any other choice as is."""
    if choice != "auto":
        return choice
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_bf16_flags() else "no"


def describe_device(device) -> str:
    """``cuda: <GPU name>``, or ``cpu: <model name>, <threads> threads, <bf16 instructions>`` (e.g. ``cpu: AMD
    EPYC, 2 threads, avx512_bf16``)."""
    if getattr(device, "type", str(device)) == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    bf16 = " ".join(cpu_bf16_flags()) or "no bf16 instructions"
    return f"cpu: {cpu_model()}, {torch.get_num_threads()} threads, {bf16}"


def matmul_isa(mixed_precision: str, flags: set[str], capability: str | None = None) -> str:
    """The instructions the CPU's matrix products run on.

    fp32: ``<capability> (MKL sgemm)``. bf16: ``AMX-BF16 (oneDNN)`` or ``AVX512-BF16 (oneDNN)`` where the CPU has AVX512
    F, BW, VL and DQ (torch's ``mkldnn_bf16_device_check``) and that instruction set; otherwise, and for fp16,
    ``<precision> converted to fp32 on <AVX512 or capability> (no <precision> instructions)``. The bf16 path is inferred
    from ``flags``, which no torch function reports; MKL's own code path is not known (``MKL_VERBOSE=1`` prints it).

    Args:
        mixed_precision: 'no', 'bf16' or 'fp16'.
        capability: the vector instruction set torch dispatches to (``AVX512``, ``AVX2``, ``DEFAULT``, ...); None:
            ``torch.backends.cpu.get_cpu_capability()``.
    """
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    onednn = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    if mixed_precision in ("bf16", "fp16"):
        if onednn and "amx_bf16" in flags and mixed_precision == "bf16":
            return "AMX-BF16 (oneDNN)"
        if onednn and "avx512_bf16" in flags and mixed_precision == "bf16":
            return "AVX512-BF16 (oneDNN)"
        vector = "AVX512" if onednn else capability
        return f"{mixed_precision} converted to fp32 on {vector} (no {mixed_precision} instructions)"
    return f"{capability} (MKL sgemm)"


def numerics(device, mixed_precision: str) -> dict:
    """What decides a run's last digits on ``device`` in ``mixed_precision`` (``resolve_mixed_precision``'s result).

    Returns:
        on a CPU ``{"processor": "cpu", "vendor": "AuthenticAMD", "model": "AMD EPYC", "family": "25",
        "model_number": "1", "threads": 2, "precision": "no", "matmul": "AVX2 (MKL sgemm)",
        "vector_kernels": "AVX2", "torch": "2.13.0+cpu"}``: ``matmul`` by ``matmul_isa``, ``vector_kernels`` the
        instruction set of torch's elementwise and reduction kernels (softmax, GELU, LayerNorm;
        ``torch.backends.cpu.get_cpu_capability``, which ``ATEN_CPU_CAPABILITY`` can lower); on a GPU
        ``{"processor": "cuda", "gpu": <name>, "compute_capability": "9.0", "precision", "tf32_matmul": bool,
        "torch"}``.
    """
    if getattr(device, "type", str(device)) == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return {"processor": "cuda", "gpu": torch.cuda.get_device_name(device),
                "compute_capability": f"{major}.{minor}", "precision": mixed_precision,
                "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "torch": torch.__version__}
    info = cpu_info()
    return {"processor": "cpu", "vendor": info.get("vendor_id", "unknown"), "model": cpu_model(),
            "family": info.get("cpu family", "unknown"), "model_number": info.get("model", "unknown"),
            "threads": torch.get_num_threads(), "precision": mixed_precision,
            "matmul": matmul_isa(mixed_precision, set(info.get("flags", "").split())),
            "vector_kernels": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def serving_dtype(device: str) -> torch.dtype | None:
    """The dtype the servers and the benchmarks run the ``pytorch`` form in on ``device``: None (the model's own,
    fp32) on ``cpu``; on a CUDA GPU bf16, fp16 where the GPU lacks bf16."""
    if device == "cpu":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
