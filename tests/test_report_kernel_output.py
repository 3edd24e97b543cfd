"""What the notebooks rftlib executes print: only what a user should read.

``make demo``'s output carried three "[IPKernelApp] WARNING | Kernel is running over TCP without encryption"
lines, one per kernel papermill started (the train notebook, the report's analysis notebook, ...).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]


def test_a_notebook_rftlib_executes_prints_no_kernel_transport_warning(tmp_path):
    nb = new_notebook(cells=[new_code_cell("print('the cell ran')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "t.ipynb")
    code = ("import sys; from rftlib.report.publish import execute; "
            f"execute({str(tmp_path / 't.ipynb')!r}, {str(tmp_path / 'out.ipynb')!r}, {{}}, log=True)")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "the cell ran" in p.stdout + p.stderr
    out = p.stdout + p.stderr
    assert "without encryption" not in out and "IPKernelApp" not in out, out[-3000:]


def test_every_notebook_is_executed_through_the_one_runner():
    """rftlib.report.publish.run_papermill is the only caller of papermill: a new call site gets its kernel
    manager (and so its quiet, private kernel) by using it."""
    calls = {str(p.relative_to(REPO)) for p in (REPO / "rftlib").rglob("*.py")
             if re.search(r"\bexecute_notebook\(", p.read_text())}
    assert calls == {"rftlib/report/publish.py"}


def test_the_setup_scripts_deepspeed_check_prints_nothing():
    """make demo runs scripts/setup.sh first; its "is deepspeed installed" probe let DeepSpeed's
    "[WARNING] [real_accelerator.py] Setting accelerator to CPU. If you have GPU ..." through on stdout."""
    (line,) = [ln for ln in (REPO / "scripts" / "setup.sh").read_text().splitlines() if '-c "import deepspeed"' in ln]
    probe = line.split("if !", 1)[1].split("; then", 1)[0]  # the probe command, as the script runs it
    p = subprocess.run(["bash", "-c", f'VENV=.venv; if ! {probe}; then echo "deepspeed missing"; fi'], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr
