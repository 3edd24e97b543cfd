"""The notebook templates in notebooks/, built from code so they never drift from the library.
``python -m rftlib.notebooks`` rewrites them (outputs cleared, stable cell ids).

Each has one ``parameters`` cell of typed, commented literals (papermill ``-p NAME VALUE``;
``papermill --help-notebook`` lists them) and cells that only call into rftlib: the logic is in
rftlib (report, workbench, validate, sft, launch) where the tests reach it.

    train.ipynb     one attempt: config -> train -> plots -> every checkpoint evaluated -> report
    sft.ipynb       the SFT stage: format compliance and accuracy before/after, the adapter RL starts from
    validate.ipynb  seed 002's loop validation: component, timing and memory tables with evidence
    analysis.ipynb  one attempt's report (reports/<attempt-id>.html)
    compare.ipynb   A/B of two or more attempts with paired-bootstrap CIs
    launch.ipynb    plan, start, watch, re-attach and stop a detached attempt (rftlib.launch.notebook.run)

This is the one notebook builder: each template is a function returning its notebook, listed in
``TEMPLATES``; ``_notebook`` gives every cell a stable id, so regenerating gives the same bytes.
train.ipynb's parameters cell is :func:`parameters_cell`, generated from RunConfig (and
``NOTEBOOK_PARAMS``, the notebook's own parameters, which rftlib.workbench.collect reads back).

One convention for "a preset plus what this run changes", in every notebook's parameters cell:

    preset      a params/<name>.yaml preset (or a path to one): where every RunConfig field starts
    overrides   a dict of RunConfig fields over the preset, each value kept as given (0, False, "" too):
                ``-p overrides '{"beta": 0}'`` works in every notebook
    NAME        a named setting: a RunConfig field the notebook shows on its own line (train.ipynb shows
                every field); None means "the preset's value", anything else, 0, False and "" included,
                is the value (``-p beta 0`` is beta 0, ``-p num_steps 0`` is asked for, and refused by
                the config if it is out of range, never silently replaced)

A field given both in ``overrides`` and by name with two different values is refused (which one was
meant?). :func:`preset_overrides` applies the convention (train.ipynb through rftlib.workbench.collect, sft.ipynb
and validate.ipynb through their ``start``); launch.ipynb names no field and hands ``overrides`` on as given.
Settings of the notebook itself, not of the RunConfig (``attempt_id``, ``resume``, ``attach``,
``watch_seconds``, ...), use None for "not given" too; those with a real default (``dry_run = True``,
``control_steps = 2``) show it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from rftlib.config import ConfigError, RunConfig, config_fields, field_docs, to_dict

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def preset_overrides(overrides: dict[str, Any] | None = None, **named: Any) -> dict[str, Any]:
    """The RunConfig fields a notebook sets over its preset, by the one convention (module docstring):
    ``overrides`` as given (0, False and "" kept), then each named setting that is not None. A field given
    both ways with two different values is a ConfigError naming it."""
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError(f"overrides must be a dict of RunConfig fields, e.g. {{'beta': 0}}; got {overrides!r}")
    out = dict(overrides or {})
    for k, v in named.items():
        if v is None:
            continue  # the preset's value
        if k in out and out[k] != v:
            raise ConfigError(f"{k} is given twice: {k} = {v!r} and overrides[{k!r}] = {out[k]!r}; keep one")
        out[k] = v
    return out


# parameters of the notebook itself (not of the RunConfig)
NOTEBOOK_PARAMS: dict[str, tuple[Any, str]] = {
    "preset": ("default", "a params/<name>.yaml preset or a path to one"),
    "overrides": ({}, "RunConfig fields over the preset, kept as given (0 and False too), e.g. {'beta': 0}; "
                      "the named fields below do the same one by one (None: the preset's)"),
    "attempt_id": (None, "run directory name; None picks the next attempt-NN-<name>"),
    "resume": (None, "an attempt directory to continue from its step_latest (seed 001 resume)"),
    "additional_steps": (None, "with resume: train this many more steps than the attempt had"),
    "live_view": (True, "ipywidgets panel in JupyterLab (with a Stop button); False, or any headless run "
                        "(papermill, rft), prints one text line per step"),
    "skip_preflight": (False, "launch even if the LR preflight refuses (seed 003 preflight_lr.sh)"),
    "nproc": (1, "ranks on this machine; > 1 starts them with torchrun (backend ddp or deepspeed) and streams their lines"),
}


def parameters_cell() -> str:
    """The source of train.ipynb's ``parameters`` cell, generated from RunConfig so they never drift."""
    docs = field_docs()
    defaults = to_dict(RunConfig())
    lines = ["# Parameters (papermill -p NAME VALUE, or -f params/<preset>.yaml). None = preset value, else default.",
             "# Notebook"]
    for k, (v, doc) in NOTEBOOK_PARAMS.items():
        lines.append(f"{k} = {v!r}  # {doc}")
    lines.append("# RunConfig (its fields: rftlib/settings.py): default shown in the comment")
    for name, f in config_fields().items():
        # one line each; no '=' in the comment (papermill's parameter parser would stop there)
        doc = " ".join(docs.get(name, "").split()).replace(" = ", ": ").replace("=", ":")
        lines.append(f"{name} = None  # [{defaults[name]!r}] {doc}")
    return "\n".join(lines) + "\n"




def _params(source: str) -> nbformat.NotebookNode:
    cell = new_code_cell(source)
    cell.metadata["tags"] = ["parameters"]
    return cell


def _notebook(name: str, cells: list) -> nbformat.NotebookNode:
    for i, c in enumerate(cells):  # stable ids: regenerating gives the same file
        c["id"] = f"{name}-{i:02d}"
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


md, code = new_markdown_cell, new_code_cell


def train_notebook() -> nbformat.NotebookNode:
    cells = [
        md("# GRPO attempt\n\nOne attempt: resolve the config (preset + parameters), train, "
           "evaluate on the held-out set, plot. Run headless with\n"
           "`papermill notebooks/train.ipynb out.ipynb -p eps_clip 0.1` or `-f params/<preset>.yaml`.\n\n"
           "The attempt goes to `<project root>/runs/attempt-NN-<name>/` (or `$RFTLIB_RUNS`), whatever the "
           "kernel's working directory, and its report to `reports/`. In JupyterLab the live view's **Stop** "
           "button checkpoints after the current step and stops; *Kernel > Interrupt* stops mid-step and keeps "
           "only the last checkpoint (`training_state/step_latest`)."),
        _params(parameters_cell()),
        code("from rftlib import workbench as wb\n\nrun = wb.start(globals())\nprint(wb.describe(run))"),
        code("summary = wb.train(run)\nprint(wb.result_text(summary))"),
        code("wb.plot_run(run.run_dir)  # the last expression of the cell: shown as a PNG, here and in papermill's output"),
        md("## Every checkpoint, the final one included\n\n`training_state/step_N` evaluated greedily on the "
           "held-out set into `eval/ckpt_step_N.json` (resumable; a state the trainer already evaluated is "
           "reused). Then the attempt's report, `reports/<attempt-id>.html`, and the index are (re)written."),
        code("from rftlib import eval_checkpoints\nfrom rftlib.report import publish\n\nckpt = eval_checkpoints.eval_checkpoints(run.run_dir)"),
        code("report = publish.write_report(run.run_dir)\nprint(f\"report: {report}\\nindex:  {report.parent / 'index.html'}\")"),
        md("## Format compliance\n\nSeed 003 section 12: when the base model's \\\\boxed{} rate on the step-0 held-out eval "
           "is below 95%, run SFT first (`rft sft`, notebooks/sft.ipynb) and start RL from its adapter."),
        code("from rftlib.sft import format_check\n\nprint(format_check(run.run_dir))"),
        *conclusion_cells("run.run_dir"),
    ]
    return _notebook("train", cells)


def conclusion_cells(run_dir: str) -> list:
    """The research-log cell: after reading the report, a dated conclusion appended to the attempt
    (what ``rft note`` does); an empty text writes nothing."""
    return [
        md("## Conclusions\n\nAfter reading the report: what did this attempt teach, and what comes next? "
           "Write it in the cell below and run it (or `rft note RUN_DIR \"...\"` from a shell); the report and "
           "the index show it, dated, beside the hypothesis (`notes`) set at launch."),
        code("from rftlib.report import attempt as research_log\n\n"
             f"if research_log.conclude({run_dir}, \"\"):  # <- your conclusion here\n"
             f"    print(publish.write_report({run_dir}))"),
    ]


SFT_PARAMS = '''\
# Parameters (papermill -p NAME VALUE). Typed literals only; the work is in rftlib.sft.
preset: str = "sft-arithmetic-boxed"  # params/<name>.yaml: model, task, sft_data (the SFT split) and the schedule
overrides: dict = {}  # RunConfig fields over the preset, kept as given (0 and False too), e.g. {"num_steps": 10, "report_to": ["tensorboard", "mlflow"]}
notes: str = None  # the hypothesis, shown in the report and the index; None: the preset's
runs_root: str = None  # where the attempt's run directory is made; None: the preset's
attempt_id: str = None  # run directory name; None picks the next attempt-NN-<name>
'''


def sft_notebook() -> nbformat.NotebookNode:
    cells = [
        md("# SFT stage\n\nSeed 003 section 12: when the base model's format compliance (the \\\\boxed{} rate) is "
           "below 95%, SFT on the prepared split first; seed 001 starts RL from the SFT adapter. TRL's SFTTrainer "
           "trains a LoRA (or, with `lora_rank` 0, the full model) with completion-only loss; the held-out set is "
           "evaluated greedily before and after. The attempt's `adapter/` is what an RL preset starts from "
           "(`init_adapter`), and that attempt's report links back here. Headless: `rft sft -p PRESET`."),
        _params(SFT_PARAMS),
        code("from rftlib import sft\n\ncfg, run_dir = sft.start(preset, overrides, notes=notes, runs_root=runs_root, "
             "attempt_id=attempt_id)\nprint(run_dir)"),
        code("summary = sft.run_sft(cfg, run_dir)"),
        code("sft.before_after(run_dir)"),
        code("sft.loss_plot(run_dir)"),
        md("## Report\n\nThe attempt's report, `reports/<attempt-id>.html`, and the index are (re)written."),
        code("from rftlib.report import publish\n\nreport = publish.write_report(run_dir)\nprint(f\"report: {report}\")"),
        *conclusion_cells("run_dir"),
    ]
    return _notebook("sft", cells)


VALIDATE_PARAMS = '''\
# Parameters (papermill -p NAME VALUE). Typed literals only; the work is in rftlib.validate.
preset: str = "seed002-fizzbuzz-rtx3080-cpu"  # params/<name>.yaml; -cpu: SmolLM2-135M on sandboxed FizzBuzz-like code here (~1 min), -tiny-cpu: the untrained tiny model (a plumbing check, ~10 s), no suffix: the seed's GPU setup (Qwen2.5-Coder-0.5B-Instruct)
overrides: dict = {}  # RunConfig fields over the preset, kept as given (0 and False too), e.g. {"rewards": {"task": 1, "truncated_penalty": 0.1}}
model: str = None  # the policy (HF id or local dir); None: the preset's
task: str = None  # None: the preset's
num_steps: int = None  # steps with the task reward; None: the preset's (seed 002: 5)
beta: float = None  # KL coefficient; None: the preset's (seed 002: 0.04); 0 is no KL term (seed 003's 120b runs)
notes: str = None  # the hypothesis, shown in reports and the index; None: the preset's
runs_root: str = None  # where the validation attempt's run directory is made; None: the preset's
attempt_id: str = None  # run directory name; None picks the next attempt-NN-<name>
control_steps: int = 2  # extra steps with a coin-flip reward, run only if no task step changed the weights
'''


def validate_notebook() -> nbformat.NotebookNode:
    cells = [
        md("# GRPO training loop validation (seed 002, Experiment 07)\n\n"
           "A short run that checks every component of the loop (rollout -> reward -> advantage -> update) and "
           "fills the seed's tables with measured evidence. Extraction and test execution are also checked on "
           "control completions built from the gold answer; if the task reward gives no learning signal (seed "
           "002's all-1.0 rewards, or an untrained model), control-reward steps check backprop and KL anyway, "
           "marked as such.\n\nOn a GPU box: `papermill notebooks/validate.ipynb out.ipynb -p preset "
           "seed002-fizzbuzz-rtx3080`."),
        _params(VALIDATE_PARAMS),
        code("from rftlib import validate as V\n\n"
             "cfg, run_dir = V.start(preset, attempt_id=attempt_id, overrides=overrides, model=model, task=task,\n"
             "                       num_steps=num_steps, beta=beta, notes=notes, runs_root=runs_root)\n"
             "v = V.run_validation(cfg, run_dir, control_steps=control_steps)\n"
             "print(V.summary_text(v))"),
        md("## Component Validation"),
        code("V.component_table(v)"),
        md("## Metrics Summary"),
        code("V.steps_table(v)"),
        md("## Timing Analysis"),
        code("V.timing_table(v)"),
        md("## Memory Usage"),
        code("V.memory_table(v)"),
        md("## Success Criteria Evaluation"),
        code("V.criteria_table(v)"),
        md("## Control completions"),
        code("V.controls_block(v)"),
    ]
    return _notebook("validate", cells)


ANALYSIS_PARAMS = '''\
# Parameters (papermill -p NAME VALUE). Typed literals only; the work is in rftlib.report.analysis.
run_dir: str = "runs/attempt-01-smollm2-arithmetic"  # the attempt's run directory
baseline_attempt: str = None  # a run directory to diff the config against; None: the RunConfig defaults
n_samples: int = 4  # completions shown per samples table
'''


def analysis_notebook() -> nbformat.NotebookNode:
    cells = [
        md("# Attempt report\n\nEverything below is read from the attempt's run directory. Metric tiers follow "
           "seed 003 section 7; health verdicts are its section 12 smoke tests and section 7 warnings."),
        _params(ANALYSIS_PARAMS),
        code("from rftlib.report import analysis as A, plots as P\n\na = A.load_attempt(run_dir)\nA.header(a)"),
        md("## Health verdicts"),
        code("A.verdict_table(a)"),
        md("## Tier 1: ground truth"),
        code("P.tier1(a)"),
        md("## Held-out eval against the step-0 baseline"),
        code("P.eval_curve(a)"),
        code("A.checkpoint_table(a)"),
        md("## Tier 2: stability"),
        code("P.tier2(a)"),
        code("A.spike_table(a)"),
        md("## Recorded batches: every token of a step, and its replay under other losses"),
        code("A.records_table(a)"),
        md("## Tier 3: collapse detection"),
        code("P.tier3(a)"),
        md("## Timeline: where the time went (engines, producer, trainer) and how stale the batches were"),
        code("P.timeline(a)"),
        md("## Per-step metrics"),
        code("A.metrics_table(a)"),
        md("## Sample completions"),
        code("A.samples_table(a, n_samples)"),
        code("A.eval_samples_table(a, n_samples)"),
        md("## Config"),
        code("A.config_diff(a, baseline_attempt)"),
        code("A.config_table(a)"),
        md("## Provenance"),
        code("A.provenance_table(a)"),
    ]
    return _notebook("analysis", cells)


REPLAY_PARAMS = '''\
# Parameters (papermill -p NAME VALUE). Typed literals only; the work is in rftlib.report.replay_views and record_view.
run_dir: str = ""  # the attempt (its directory, or its name under the runs root); "": the newest attempt with a record
step = None  # the recorded step to replay (None: the latest recorded; records/ lists them)
counterfactuals: list = [{"policy_loss": "gspo"}, {"policy_loss": "cispo"}]  # loss settings to replay the same batch under
weights: str = "auto"  # auto (the record's snapshot, else the step-before checkpoint), snapshot, or "ckpt:M"
'''


def replay_notebook() -> nbformat.NotebookNode:
    cells = [
        md("# Replay a recorded step\n\nThe trainer's own update, run again on the recorded batch from the weights "
           "it started from (rftlib.train.replay): the verdict says whether it reproduced every recorded logprob, "
           "loss and grad norm bit for bit. In another environment (threads, CPU kernels, device) the recorded "
           "configuration runs first as the control: refused when its logprobs are further from the record than "
           "this precision's measured noise allows (wrong weights), else CONTROLLED, with the control's own gap to "
           "the record printed as the environment's noise and every counterfactual read as its difference from the "
           "control (d_* columns). Each counterfactual is the same batch on the same weights under another "
           "loss: its loss, gradient norm and the cosine of its gradient with the recorded one, per optimizer "
           "step. An on-policy step (one optimizer step, HF engine) has every ratio at exactly 1: no clip range "
           "clips anything there, and losses differ only by their aggregation; several optimizer steps per rollout "
           "(train_batch_size < rollout_batch_size) or a vLLM engine make the later steps off-policy."),
        _params(REPLAY_PARAMS),
        code("from rftlib.report import record_view as RV, replay_views\n\n"
             "res = replay_views.run(run_dir, step, counterfactuals, weights)\nRV.verdict(res)"),
        md("## Per optimizer step and configuration"),
        code("RV.table(res)"),
        md("## Every token: what each loss did to it\n\nColour by the gradient weight dL/dlogp (which tokens the "
           "update pushed up or down), the ratio, the clip side, the entropy or the engine gap; sort the groups; "
           "hover a token for every value under every configuration."),
        code("RV.inspector(res)"),
    ]
    return _notebook("replay", cells)


COMPARE_PARAMS = '''\
# Parameters (papermill -p NAME VALUE). Typed literals only; the work is in rftlib.report.compare.
attempts: list = ["runs/attempt-28-eps-clip-0.2", "runs/attempt-28-eps-clip-0.1"]  # run directories; the first is the reference A (seed 003: a28a eps_clip 0.2 vs a28b 0.1)
n_boot: int = 10000  # bootstrap resamples for the paired confidence intervals
'''


def compare_notebook() -> nbformat.NotebookNode:
    cells = [
        md("# A/B comparison\n\nTwo or more attempts side by side. Accuracy differences come with a paired "
           "bootstrap 95% confidence interval over the held-out problems (each problem evaluated by both "
           "attempts): on a small eval set one problem is several points, so a difference whose interval "
           "contains 0 is not evidence of anything."),
        _params(COMPARE_PARAMS),
        code("from rftlib.report import compare as C, plots as P\n\natts = C.load_all(attempts)\nC.header(atts)"),
        md("## Differences against the first attempt"),
        code("C.difference_table(atts, n_boot=n_boot)"),
        md("## Held-out eval curves"),
        code("P.overlay_eval(atts)"),
        md("## Training metrics, overlaid"),
        code("P.overlay(atts)"),
        md("## Config differences"),
        code("C.config_diff_table(atts)"),
        md("## Health, side by side"),
        code("C.verdicts_side_by_side(atts)"),
    ]
    return _notebook("compare", cells)


LAUNCH_PARAMETERS = '''\
preset = "seed003-gpt-oss-20b-a28b"  # a preset in params/ (its launch layout: train_gpus, rollout_gpus, engines)
overrides = {}                       # RunConfig fields over the preset, kept as given (0 and False too), e.g. {"num_steps": 50}
dry_run = True                       # True: print the GPU map and the commands, start nothing
machine_gpus = None                  # GPUs to assume on this machine (None: detect); for planning elsewhere
resume = None                        # a run directory: relaunch that attempt from its step_latest
attach = None                        # a run directory: re-attach to it (nothing is launched)
stop = False                         # with attach: stop that attempt cleanly (checkpoint first)
watch_seconds = None                 # after a launch / with attach: stream progress this long, then detach (None: don't)
smoke = False                        # True: first `rft smoke` (one step per set-up on this machine, ~10 min)
'''

LAUNCH_SMOKE = '''\
if smoke:  # the first thing to run on a new machine: one step per set-up and a pass/fail table (rftlib.smoke)
    from rftlib.smoke import run_smoke, table, verdict

    smoke_rows = run_smoke()
    print(table(smoke_rows))
    assert verdict(smoke_rows), "rft smoke failed: fix the failing line before launching (its log is named above)"
'''

LAUNCH_RUN = '''\
from rftlib.launch.notebook import run

attempt = run(preset=preset, overrides=overrides, dry_run=dry_run, machine_gpus=machine_gpus, resume=resume,
              attach=attach, stop=stop, watch_seconds=watch_seconds)
'''

LAUNCH_STATUS = '''\
from rftlib.launch.status import status_text

print(status_text(overrides.get("runs_root")))
'''


def launch_notebook() -> nbformat.NotebookNode:
    """launch.ipynb: a parameters cell, the launch/attach call (rftlib.launch.notebook.run), the status table."""
    cells = [
        md("# Launch an attempt (detached)\n\nPlans the attempt's processes from the preset's "
           "launch layout (trainer ranks under torchrun, vLLM server engines), checks the plan "
           "against this machine, and with `dry_run=False` starts them in their own session: "
           "they outlive this kernel. Re-attach with `attach=\"runs/<attempt>\"` (or "
           "`rft attach`), stop with `attach=... stop=True` (or `rft stop`)."),
        _params(LAUNCH_PARAMETERS),
        code(LAUNCH_SMOKE),
        code(LAUNCH_RUN),
        md("## Attempts and GPUs"),
        code(LAUNCH_STATUS),
    ]
    return _notebook("launch", cells)


TEMPLATES = {"train.ipynb": train_notebook, "sft.ipynb": sft_notebook, "validate.ipynb": validate_notebook,
             "analysis.ipynb": analysis_notebook, "compare.ipynb": compare_notebook, "launch.ipynb": launch_notebook,
             "replay.ipynb": replay_notebook}


def write_all() -> list[Path]:
    NOTEBOOKS.mkdir(exist_ok=True)
    out = []
    for name, build in TEMPLATES.items():
        path = NOTEBOOKS / name
        nbformat.write(build(), path)
        out.append(path)
    return out


if __name__ == "__main__":
    for p in write_all():
        print(p)
