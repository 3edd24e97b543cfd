#!/usr/bin/env bash
# Idempotent install of Debian's headless-capable Chromium, used only by the report screenshot
# tests (tests/test_notebooks_reports.py): they open reports/<attempt>.html and reports/index.html,
# check the DOM for the embedded figures and save a screenshot of each. Without a browser those
# tests skip with the reason; nothing else in rftlib needs one.
#   bash scripts/setup_browser.sh        (as root, or with passwordless sudo)
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
for b in chromium chromium-browser google-chrome; do
  if have "$b"; then echo "[setup_browser] $b already installed: $(command -v "$b")"; exit 0; fi
done
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if have sudo && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "[setup_browser] not root and no passwordless sudo: install chromium yourself (apt-get install chromium)" >&2
    exit 1
  fi
fi
if ! have apt-get; then
  echo "[setup_browser] no apt-get (not Debian/Ubuntu): install Chromium with your package manager" >&2
  exit 1
fi
echo "[setup_browser] apt-get install chromium (and fonts so text renders in screenshots)"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null && echo "[setup_browser] installed: $(chromium --version 2>/dev/null || echo chromium)"
