"""``rft --help``, ``rft status`` and ``rft note`` answer without importing torch, transformers, peft, papermill
or any other verb's module: the verb table is written once (rftlib.cli.VERBS) and main imports only the verb
asked for. Each runs in a fresh interpreter in which importing a heavy package raises, so a heavy import
anywhere on the verb's path fails the command (timings are bench material: none here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rftlib.cli import VERBS
from rftlib.config import make_config, to_dict

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "peft", "papermill", "deepspeed", "vllm", "nbconvert", "ipywidgets", "matplotlib")

# a finder that refuses the heavy packages, then rft's own main on the given arguments
BLOCKED_RFT = f"""
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {HEAVY!r}:
            raise ImportError('heavy import on a light path: ' + name)
sys.meta_path.insert(0, Refuse())
from rftlib.cli import main
try:
    code = main(sys.argv[1:])
finally:
    print('VERB MODULES', sorted(m for m in sys.modules if m.startswith('rftlib.cli.')))
sys.exit(code)
"""


def rft_light(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-c", BLOCKED_RFT, *args], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def attempt(tmp_path):
    """An attempt directory as rftlib.attempts.create_attempt writes it (config.yaml: the resolved config and
    its provenance), the provenance left empty: recording it imports torch, and this file runs without it."""
    run_dir = tmp_path / "runs" / "attempt-01-tiny"
    run_dir.mkdir(parents=True)
    cfg = make_config("tiny", {"runs_root": str(tmp_path / "runs")})
    doc = {"attempt_id": run_dir.name, "config": to_dict(cfg), "provenance": {}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return run_dir


def test_help_lists_every_verb_and_imports_none_of_them():
    p = rft_light("--help")
    assert p.returncode == 0, p.stderr[-3000:]
    for verb, (module, help_) in VERBS.items():
        assert f"    {verb} " in p.stdout and module == f"rftlib.cli.{verb}"
    assert "VERB MODULES []" in p.stdout


def test_status_answers_without_heavy_imports(attempt):
    p = rft_light("status", "--runs", str(attempt.parent))
    assert p.returncode == 0, p.stderr[-3000:]
    assert attempt.name in p.stdout and "not started" in p.stdout
    assert "VERB MODULES ['rftlib.cli.status']" in p.stdout


def test_note_answers_without_heavy_imports(attempt, tmp_path):
    p = rft_light("note", str(attempt), "lesson: light", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "lesson: light" in (attempt / "notes.jsonl").read_text()
    assert (tmp_path / "reports" / "index.html").exists()


def test_a_verb_flag_error_and_python_m_still_work():
    """The verb's own parser is built when the verb is chosen: its arguments and errors are as before."""
    p = subprocess.run([sys.executable, "-m", "rftlib.cli", "note", "somewhere"], cwd=REPO, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert p.returncode == 2 and "the following arguments are required: text" in p.stderr
