"""What a run's numbers depend on besides params, data, code and packages: the processor, its instructions, the
threads and the precision (docs/reproducibility.md).

The same run gives the same metrics to the last digit on the same kind of CPU and precision; across CPU vendors the
matmul and vector kernels differ in the order they add, and so do the last bits of every logit. ``numerics`` writes
down each of those facts in ``metrics/train.json``, so two runs' files say why their metrics differ.
"""

from __future__ import annotations

from pathlib import Path


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
    """The Accelerate ``mixed_precision`` for a params choice; 'auto' picks what the hardware runs fast.

    'auto' is bf16 autocast on a GPU with bf16 (Ampere and newer) or a CPU with bf16 instructions (AVX512-BF16
    or AMX, read from /proc/cpuinfo), fp16 with a gradient scaler on an older GPU, and fp32 ('no') elsewhere.
    Any other choice is returned as is.
    """
    if choice != "auto":
        return choice
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_bf16_flags() else "no"


def describe_device(device) -> str:
    """The hardware a run's numbers depend on, in one line: the GPU's name, or the CPU's model name, its
    threads and its bf16 instructions (e.g. ``cpu: AMD EPYC, 2 threads, avx512_bf16``). ``mixed_precision: auto``
    resolves differently across them, and so do the metrics (docs/reproducibility.md)."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    bf16 = " ".join(cpu_bf16_flags()) or "no bf16 instructions"
    return f"cpu: {cpu_model()}, {torch.get_num_threads()} threads, {bf16}"


def matmul_isa(mixed_precision: str, flags: set[str], capability: str | None = None) -> str:
    """The instructions the CPU's matrix products run on, for a precision and the CPU's ``/proc/cpuinfo`` flags.

    Read: the vector instruction set torch dispatches its CPU kernels to, ``torch.backends.cpu.get_cpu_capability()``
    (``AVX512``, ``AVX2``, ``DEFAULT``, ...; ``capability`` stands in for it). fp32 products go to MKL's sgemm
    (torch's CPU wheel: ``BLAS_INFO=mkl``), named with that reading: the widest set torch found usable on the CPU.
    MKL picks its own code path, which torch can't report (``MKL_VERBOSE=1`` prints it), and ``ATEN_CPU_CAPABILITY``
    lowers only torch's.

    Inferred from ``flags``, which no torch function reports: whether bf16 products run on bf16 instructions. Under
    autocast torch sends them to oneDNN where the CPU has AVX512 with BW, VL and DQ (torch's
    ``mkldnn_bf16_device_check``), and oneDNN picks AMX tiles, else AVX512-BF16's dot products, else converts on
    AVX512 ("CPU ISA hints" in its docs); elsewhere torch converts bf16 (and fp16) in its own kernels, on the read
    instruction set.
    """
    if capability is None:
        import torch

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
    import torch

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
