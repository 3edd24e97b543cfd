#!/usr/bin/env bash
# Idempotent set-up of the code-reward sandbox (rftlib/rewards/sandbox): fast when already done.
#   apt:  bubblewrap (the namespaces sandbox), python3 (the interpreter that runs inside it: the
#         sandbox's unprivileged uid cannot read a venv or pyenv under /root), libseccomp2
#   pip:  pyseccomp==0.1.2 into .venv (compiles the seccomp filter through libseccomp)
# No users are created: workers run as fixed high uids (2100000000 + i) that need no passwd entry.
# Ends with `python -m rftlib.rewards.sandbox --check`, which fails if bwrap cannot start here.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
[ -x /usr/bin/python3 ] || need+=(python3)
{ /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null || true; } | grep -q 'libseccomp\.so\.2' || need+=(libseccomp2)
if [ ${#need[@]} -gt 0 ]; then
  echo "[setup_sandbox] apt-get install ${need[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
      echo "[setup_sandbox] FAILED: not root and no passwordless sudo; install: ${need[*]}" >&2; exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_sandbox] FAILED: no $VENV (run scripts/setup.sh first)" >&2; exit 1
fi
if ! "$VENV/bin/python" -c "import pyseccomp" >/dev/null 2>&1; then
  echo "[setup_sandbox] pip install pyseccomp==0.1.2"
  "$VENV/bin/pip" install -q --disable-pip-version-check pyseccomp==0.1.2 2>&1 | grep -v "is ignored" || true
fi
"$VENV/bin/python" -m rftlib.rewards.sandbox --check | sed 's/^/[setup_sandbox] /'
