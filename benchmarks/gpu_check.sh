#!/usr/bin/env bash
# The GPU path, checked on a machine with one NVIDIA GPU (docs/results.md, "On a GPU"):
#
#   bash benchmarks/gpu_check.sh [OUT]          # OUT: logs, metrics and steps.tsv (default: gpu-check/)
#
# Run it in the repository once its packages are installed: `TORCH_SPEC='torch==<version>+cu<NNN>
# --index-url https://download.pytorch.org/whl/cu<NNN>' bash .ci/setup`, or the machine's own CUDA build of torch with
# the lock's other packages on PYTHONPATH (PYTHON names that interpreter). It works in a scratch copy of the tracked
# files ($WORK, default /tmp/gpu-check), so the checkout's dvc.lock and metrics stay as they are. Steps, each bounded
# by $STEP_TIMEOUT seconds (default 600); a failed step is recorded and the next one runs:
#   1. environment: the GPU, torch and its CUDA, bf16, ONNX Runtime's providers (OUT/environment.json)
#   2. repro: `dvc repro` on the defaults; train.mixed_precision auto trains in bf16 on the GPU. The export stage's
#      forms are CPU runtimes (ONNX Runtime's CPU provider, OpenVINO): they are made and timed on the CPU
#   3. serve: benchmarks/load.py with --device cuda: tools.serve's PyTorch model in bf16 against pipeline() in fp32,
#      both on the GPU (LOAD_REQUESTS requests per level, default 816)
#   4. base: the base-size recipe (docs/base-size-checkpoint.md) for one epoch, `dvc exp run evaluate`;
#      BASE_CHECKPOINT names another checkpoint (a Hub id, or a folder)
# OUT/steps.tsv: step, exit status, seconds.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "${1:-gpu-check}" && cd "${1:-gpu-check}" && pwd)
WORK=${WORK:-/tmp/gpu-check}
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=$(command -v python3); fi
fi
BASE_CHECKPOINT=${BASE_CHECKPOINT:-sentence-transformers/all-mpnet-base-v2}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

# The stages run `python -m stages.<name>`: `python` is this interpreter
mkdir -p "$WORK/bin" && rm -f "$WORK/bin/python" && printf '#!/bin/sh\nexec "%s" "$@"\n' "$PYTHON" > "$WORK/bin/python" && chmod +x "$WORK/bin/python"
export PATH="$WORK/bin:$PATH"
printf 'step\texit_status\tseconds\n' > "$OUT/steps.tsv"

step() {  # step NAME COMMAND...: run it in the scratch project, log to OUT/NAME.log, record status and seconds
    local name=$1 begin status
    shift
    echo "== $name: ${*:1:160}"
    begin=$(date +%s%N)
    (cd "$WORK/project" && timeout "$STEP_TIMEOUT" "$@") > "$OUT/$name.log" 2>&1
    status=$?
    awk -v n="$name" -v s="$status" -v ns="$(( $(date +%s%N) - begin ))" 'BEGIN {printf "%s\t%s\t%.1f\n", n, s, ns / 1e9}' \
        | tee -a "$OUT/steps.tsv"
    tail -c 2000 "$OUT/$name.log" | tail -n 5
}

# The scratch project: the repository's tracked files (without git: its files less environments and caches; git
# leaves out what .gitignore names) in a fresh git repository, beside the checkout's ../shared (the GLUE local copy)
rm -rf "$WORK/project" && mkdir -p "$WORK/project"
if git -C "$REPO" rev-parse --git-dir > /dev/null 2>&1; then
    git -C "$REPO" ls-files -z | (cd "$REPO" && xargs -0 tar c) | tar x -C "$WORK/project"
else
    tar c -C "$REPO" --exclude=./.venv --exclude=./.git --exclude=./.gpu --exclude=./.whl --exclude=./.dvc/cache \
        --exclude=./.dvc/tmp --exclude=./gpu-check . | tar x -C "$WORK/project"
fi
[ -d "$REPO/../shared" ] && ln -sfn "$(cd "$REPO/../shared" && pwd)" "$WORK/shared"
(cd "$WORK/project" && git init -q && git add -A && git -c user.name=gpu-check -c user.email=gpu-check@localhost \
    commit -qm "gpu check") || exit 1

step environment "$PYTHON" -c "
import json, torch
info = {'torch': torch.__version__, 'cuda': torch.version.cuda, 'gpu': torch.cuda.is_available()}
if info['gpu']:
    info.update(device=torch.cuda.get_device_name(), bf16=torch.cuda.is_bf16_supported(),
                memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
try:
    import onnxruntime
    info['onnxruntime'] = onnxruntime.__version__
    info['onnxruntime_providers'] = onnxruntime.get_available_providers()
except ImportError:
    info['onnxruntime'] = None
print(json.dumps(info, indent=1))
open('$OUT/environment.json', 'w').write(json.dumps(info, indent=1) + '\n')
assert info['gpu'], 'torch sees no CUDA GPU'
"
step repro "$PYTHON" -m dvc repro
cp -r "$WORK/project/metrics" "$OUT/repro-metrics" 2>/dev/null
step serve "$PYTHON" -m benchmarks.load --form pytorch --device cuda --requests "${LOAD_REQUESTS:-816}" \
    --out "$OUT/SERVE-LOAD-GPU.md"
(cd "$WORK/project" && git add -A && git -c user.name=gpu-check -c user.email=gpu-check@localhost commit -qm repro > /dev/null)
step base "$PYTHON" -m dvc exp run evaluate -n base-1-epoch -S "model.checkpoint=$BASE_CHECKPOINT" \
    -S train.epochs=1 -S train.batch_size=16 -S train.lr=2e-5 -S train.scheduler=linear -S train.warmup_ratio=0.06
mkdir -p "$OUT/base-metrics" && cp "$WORK/project/metrics/"{train,eval}.json "$OUT/base-metrics/" 2>/dev/null
echo "Steps: $OUT/steps.tsv"
! grep -qP '\t[1-9][0-9]*\t' "$OUT/steps.tsv"
