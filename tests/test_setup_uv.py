"""scripts/venv_install.sh hands pip's configuration to uv (issue 41: the set-up's installs run through uv).

uv reads none of pip's configuration, so a machine whose packages come from find-links, extra indexes and a
constraints file (this one's: `pip config list`) would resolve other versions, or none, under uv. The
translation is checked on a fake `pip config list` (global file and environment entries, a list value, a
duplicate) and the fallback to pip is checked to run pip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = """\
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def fake_venv(tmp_path: Path) -> Path:
    """A venv whose pip prints CONFIG for `config list` and records any other call; python is this one."""
    bin_ = tmp_path / "venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").symlink_to(sys.executable)
    (bin_ / "pip").write_text("#!/bin/sh\nif [ \"$1\" = config ]; then cat <<'X'\n" + CONFIG + "X\nelse echo \"pip $*\" >> "
                              f"{tmp_path}/calls; fi\n")
    (bin_ / "pip").chmod(0o755)
    return bin_.parent


def bash(venv: Path, script: str, **env: str) -> str:
    p = subprocess.run(["bash", "-c", f". scripts/venv_install.sh; {script}"], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "VENV": str(venv), **env}, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_pips_configuration_becomes_uvs_arguments(tmp_path):
    args = bash(fake_venv(tmp_path), "_uv_args").split("\n")[:-1]
    pairs = list(zip(args[::2], args[1::2]))
    assert pairs == [("--find-links", "/opt/wheels"), ("--constraint", "/etc/xdg/pip/constraints.txt"),
                     ("--extra-index-url", "file:///opt/pypi/simple"),
                     ("--extra-index-url", "file:///opt/pypi-more/simple"),
                     ("--index-strategy", "unsafe-best-match")]  # find-links given twice: passed once
    env = bash(fake_venv(tmp_path / "b"), "_uv_env").split()
    assert "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in env and "UV_HTTP_TIMEOUT=180" in env


def test_rftlib_pip_pip_installs_with_pip(tmp_path):
    venv = fake_venv(tmp_path)
    bash(venv, "venv_install -e '.[dev]'", RFTLIB_PIP="pip")
    assert (tmp_path / "calls").read_text() == "pip install -q --disable-pip-version-check -e .[dev]\n"
