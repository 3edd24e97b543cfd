"""Reports as executed notebooks: papermill runs a template, nbconvert turns it into one HTML file.

- ``write_report(run_dir)``: notebooks/analysis.ipynb for one attempt, executed into
  ``<run_dir>/analysis.ipynb``, converted to ``<reports>/<attempt-id>.html``, then the index rebuilt.
- ``write_compare(run_dirs)``: notebooks/compare.ipynb into ``<reports>/compare-<A>-vs-<B>.html``.

The HTML hides the code (nbconvert's ``exclude_input``, what ``--no-input`` does) and embeds every
figure as a PNG; its template (``html_template/rft``) is JupyterLab's without the CDN scripts, so a
report opens offline with nothing to load. ``<reports>`` defaults to ``reports/`` beside the runs root.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

import nbformat
import papermill as pm
import zmq
from jupyter_client.manager import AsyncKernelManager
from nbconvert import HTMLExporter
from traitlets import default

from rftlib.attempts import run_dir_path
from rftlib.report.attempt import load_attempt
from rftlib.report.compare import compare_name, load_all
from rftlib.report.index import reports_dir_for, write_index

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
TEMPLATE_DIR = Path(__file__).resolve().parent / "html_template"


class PrivateKernelManager(AsyncKernelManager):
    """The kernel manager of every notebook rftlib executes: its kernel's channels are private to it. With
    CurveZMQ (pyzmq's libzmq has it: the kernel spec declares support) the manager provisions the keys, else
    the kernel listens on IPC sockets rather than TCP. Either way ipykernel 7 has nothing to warn about: a
    plain TCP kernel printed "[IPKernelApp] WARNING | Kernel is running over TCP without encryption" into the
    output of every ``rft`` command, three times in ``make demo``'s."""

    @default("transport_encryption")
    def _encrypt(self) -> str:
        return "auto" if zmq.has("curve") else "disabled"

    @default("transport")
    def _transport(self) -> str:
        return "tcp" if zmq.has("curve") else "ipc"

    async def _async_interrupt_kernel(self) -> None:
        """No interrupt on the way out: jupyter_client's shutdown sends SIGINT before its shutdown request, and a
        kernel the signal reaches idle logs "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel." into the
        output (seen once in `rft compare`, and failing test_report_kernel_output in one of three fresh-clone CI
        runs under load). The shutdown request alone ends an idle kernel; interrupts at other times are kept."""
        if getattr(self, "shutting_down", False):
            return
        await super()._async_interrupt_kernel()


def run_papermill(template: str | Path, out_nb: str | Path, parameters: dict[str, Any], **kw: Any) -> Any:
    """``papermill.execute_notebook`` as rftlib runs it (cwd = the repo, no progress bar, kernel python3, a
    :class:`PrivateKernelManager`): the one place a notebook is executed (rft train/sft/validate, reports)."""
    kw = {"cwd": str(REPO), "progress_bar": False, "kernel_name": "python3", **kw}
    return pm.execute_notebook(str(template), str(out_nb), parameters=parameters,
                               kernel_manager_class=PrivateKernelManager, **kw)


def execute(template: str | Path, out_nb: str | Path, parameters: dict[str, Any], *, log: bool = False) -> Path:
    """papermill-execute a notebook template with parameters (kernel python3, cwd = the repo)."""
    out_nb = Path(out_nb)
    out_nb.parent.mkdir(parents=True, exist_ok=True)
    kw: dict[str, Any] = {"log_output": True, "stdout_file": sys.stdout, "stderr_file": sys.stderr} if log else {}
    run_papermill(template, out_nb, parameters, **kw)
    return out_nb


def to_html(nb_path: str | Path, html_path: str | Path, *, title: str | None = None, show_code: bool = False) -> Path:
    """Convert an executed notebook to one self-contained HTML file, code hidden unless asked, stderr
    streams (library warnings) left out; errors and stdout stay."""
    nb = nbformat.read(str(nb_path), as_version=4)
    for cell in nb.cells:  # library warnings on stderr are noise in a report (the .ipynb keeps them)
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.get("outputs", []) if not (o.output_type == "stream" and o.name == "stderr")]
    exporter = HTMLExporter(template_name="rft", extra_template_basedirs=[str(TEMPLATE_DIR)],
                            exclude_input=not show_code, exclude_input_prompt=True, exclude_output_prompt=True,
                            embed_images=True)
    name = title or Path(html_path).stem
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": name}})
    html_path = Path(html_path)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = html_path.with_suffix(".html.tmp")
    tmp.write_text(body)
    tmp.replace(html_path)
    return html_path


def _reports_dir(run_dir: Path, reports_dir: str | Path | None) -> Path:
    return Path(reports_dir) if reports_dir is not None else reports_dir_for(run_dir.resolve().parent)


def write_report(run_dir: str | Path, reports_dir: str | Path | None = None, *, baseline_attempt: str | None = None,
                 index: bool = True, log: bool = False) -> Path:
    """Execute analysis.ipynb for one attempt and write ``<reports>/<attempt-id>.html`` (+ the index)."""
    run_dir = run_dir_path(run_dir)
    a = load_attempt(run_dir)  # fails here, with the path, before a kernel starts
    out = _reports_dir(run_dir, reports_dir)
    params = {"run_dir": str(run_dir), "baseline_attempt": str(Path(baseline_attempt).resolve()) if baseline_attempt else None}
    if (run_dir / "records").is_dir():  # the token inspector of each recorded step, linked from the report
        from rftlib.report.record_view import write_pages  # torch and the tokenizer: only where there are records
        write_pages(run_dir, out / a.attempt_id)
    nb = execute(NOTEBOOKS / "analysis.ipynb", run_dir / "analysis.ipynb", params, log=log)
    html = to_html(nb, out / f"{a.attempt_id}.html", title=f"{a.attempt_id} report")
    if index:
        write_index(run_dir.parent, out)
    return html


def write_compare(run_dirs: Sequence[str | Path], reports_dir: str | Path | None = None, *,
                  index: bool = True, log: bool = False) -> Path:
    """Execute compare.ipynb for two or more attempts; write ``<reports>/compare-<A>-vs-<B>.html``."""
    dirs = [run_dir_path(p) for p in run_dirs]
    load_all(dirs)  # fail fast on a missing attempt
    out = _reports_dir(dirs[0], reports_dir)
    name = compare_name(dirs)
    nb = execute(NOTEBOOKS / "compare.ipynb", out / f"{name}.ipynb", {"attempts": [str(p) for p in dirs]}, log=log)
    html = to_html(nb, out / f"{name}.html", title=name)
    nb.unlink()  # the HTML is the artefact; the executed notebook would clutter reports/
    if index:
        write_index(dirs[0].parent, out)
    return html
