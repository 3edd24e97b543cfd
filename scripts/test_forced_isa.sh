#!/usr/bin/env bash
# The numeric tests (pytest -m numeric: algo, trainer, distributed, HF rollout and vLLM) a second time,
# with the CPU kernels forced to another instruction set than this machine's, so summation orders change
# and an assertion that only held for one machine's kernels fails here instead of on a user's machine
# (issue 19: 4 tests that passed on AMD without AVX-512 failed on an Intel Xeon with AVX-512 + bf16).
#   - gemms: oneDNN capped at SSE4.1 and MKL at SSE4.2, below any AVX2 machine's native kernels; this
#     also turns bf16 autocast (autocast=auto) off, so on a CPU with avx512_bf16 the float32 path runs;
#   - torch's own vectorised ops (softmax, reductions): AVX2 on an AVX-512 machine. Not the scalar
#     'default' on an AVX2 machine: torch 2.13's inductor, which vLLM's CPU engine compiles with, then
#     writes C++ that does not compile ("'at::vec' has not been declared"), so they stay native there.
# Extra arguments go to pytest (e.g. -k, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
native=$("$PY" -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
export ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2
if [ "$native" = "AVX512" ]; then
  export ATEN_CPU_CAPABILITY=avx2
fi
echo "[forced ISA] native $native; ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA MKL_ENABLE_INSTRUCTIONS=$MKL_ENABLE_INSTRUCTIONS" \
     "ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-native}"
# Tests in those modules marked @pytest.mark.plumbing (they compare no kernel float) or same_kernels (bit for bit
# against a run on the same kernels) are left out (tests/conftest.py). On both cores as make test's first phase:
# the solo tests one at a time on one worker, the one-process files on the other (--solo-worker).
exec "$PY" -m pytest -q -n 2 --solo-worker --dist loadfile --no-loadscope-reorder --durations=10 -m numeric tests "$@"
