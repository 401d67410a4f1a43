#!/usr/bin/env bash
# benchmarks/distill_screen.py on a lent GPU machine (torch, transformers, accelerate; no DVC, no Hub): its inputs come
# as parts of one tar, carried over several calls (64 MiB a call) into /tmp/parts:
#   wheels/ (datasets, evaluate, pydantic, ruamel.yaml, dvclive with its dvc modules, transformers 5.24, ...),
#   glue/ (README.md and mrpc/ of ../shared/datasets/glue), models/{mpnet,minilm}/ (all-mpnet-base-v2 and the
#   embedded all-MiniLM-L6-v2: config and tokenizer files, weights cast to fp16 for the trip, model.fp16.safetensors).
#   bash benchmarks/distill_screen_gpu.sh check   # the wheels (first in the tar) import
#   bash benchmarks/distill_screen_gpu.sh run     # the screen; results in $OUT
set -euo pipefail
mkdir -p /tmp/in && cd /tmp/in
cat /tmp/parts/p* | tar x 2>/dev/null || true   # the first call has part 1 only: its whole files come out
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site wheels/*.whl
cp "$OLDPWD/benchmarks/dvclive_files_only.py" /tmp/site/sitecustomize.py  # dvclive without dvc's git layer
cd - >/dev/null
export PYTHONPATH=/tmp/site TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -c "import datasets, evaluate, pydantic, ruamel.yaml, dvclive, transformers, pyarrow, sklearn, regex, torch
Live = dvclive.Live; Live(dir='/tmp/livecheck', dvcyaml=None, save_dvc_exp=False, report=None).end()
print('imports ok: transformers', transformers.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__, 'regex', regex.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
[ "${1:-}" = run ] || exit 0
# The weights back to fp32, as the pipeline loads them (fp16 was for the trip only)
python3 - <<'PY'
from pathlib import Path
from safetensors.torch import load_file, save_file
for folder in Path("/tmp/in/models").iterdir():
    tensors = load_file(folder / "model.fp16.safetensors")
    save_file({k: (v.float() if v.is_floating_point() else v) for k, v in tensors.items()}, folder / "model.safetensors")
    (folder / "model.fp16.safetensors").unlink()
PY
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 benchmarks/distill_screen.py --work /tmp/ds --out "$OUT" --teacher /tmp/in/models/mpnet \
    --student /tmp/in/models/minilm --glue /tmp/in/glue --parallel "${PARALLEL:-10}" 2>&1 | tee "$OUT/screen.log"
