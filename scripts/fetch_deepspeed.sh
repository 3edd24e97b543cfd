#!/usr/bin/env bash
# DeepSpeed for a GPU machine with no network, carried with the repository: deepspeed==0.19.8 (PyPI ships it as
# an sdist only, ~2 MB) and the wheels of its dependencies that a CUDA torch environment may lack, for CPython
# 3.10-3.13 on linux x86-64, into an ignored folder (.gpu_wheels/deepspeed by default). torch, numpy and tqdm are
# left out: the environment that runs rftlib has them already.
#
#   bash scripts/fetch_deepspeed.sh            # here, with a package registry
#   python scripts/gpu_check.py                # on the GPU machine: its deepspeed stage installs these offline
#
# The install (what gpu_check's deepspeed stage runs when `import deepspeed` fails):
#   pip install --no-index --find-links .gpu_wheels/deepspeed setuptools wheel
#   DS_BUILD_OPS=0 pip install --no-index --find-links .gpu_wheels/deepspeed --no-build-isolation deepspeed==0.19.8
# DS_BUILD_OPS=0: no CUDA op is compiled at install (ZeRO-3 with torch's optimizers needs none; DeepSpeedCPUAdam
# would be compiled at its first use, which gpu_check's cpu_adam stage tries).
set -euo pipefail
DEST="${1:-$(cd "$(dirname "$0")/.." && pwd)/.gpu_wheels/deepspeed}"
PIP="${PIP:-python3 -m pip}"
mkdir -p "$DEST"
$PIP download --quiet --no-deps --no-binary deepspeed -d "$DEST" deepspeed==0.19.8
# the rest of requirements/requirements.txt of deepspeed 0.19.8 (einops hjson msgpack ninja numpy packaging psutil
# py-cpuinfo pydantic torch tqdm), nvidia-ml-py (its setup.py adds it on a CUDA machine), and setuptools + wheel
# (the sdist builds with --no-build-isolation; a python 3.12+ venv has no setuptools)
DEPS="einops hjson msgpack ninja packaging psutil py-cpuinfo pydantic nvidia-ml-py setuptools wheel"
for v in 3.10 3.11 3.12 3.13; do
  $PIP download --quiet --only-binary=:all: --python-version "$v" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$DEST" $DEPS
done
# the resolver also pulls these in as dependencies of the list above: the GPU environment has its own
rm -f "$DEST"/numpy-* "$DEST"/torch-* "$DEST"/tqdm-*
echo "$DEST: $(ls "$DEST" | wc -l) files, $(du -cb "$DEST"/* | tail -1 | cut -f1) bytes"
