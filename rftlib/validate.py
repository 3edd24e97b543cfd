"""Seed 002 ("Experiment 07: GRPO Training Loop Validation") as a function: a short run that checks
every component of the loop and fills the seed's tables with evidence, not assertions.

``run_validation(cfg)`` builds a :class:`~rftlib.train.loop.Trainer`, runs ``cfg.num_steps``
steps of :meth:`Trainer.step` with the task reward (recording every completion and reward), and
snapshots the trainable parameters before and after each step. Then:

- Component Validation: rollout, parseable output, extraction, test execution (code tasks) /
  answer check (math), reward computation, reward tensor, advantages, KL penalty, backpropagation,
  finite losses. Extraction and execution are also checked on *control* completions built from the
  gold answer (a right one must score 1, a wrong one less), so they are tested even when the model
  writes nothing usable (the untrained tiny model in CI).
- If no task step changed the weights (seed 002's own case: every reward 1.0, so every advantage 0;
  or an untrained model that never scores), ``control_steps`` more steps run with a *control reward*
  (a deterministic coin flip on the completion's hash: mixed rewards within groups). They exercise
  the advantage -> loss -> backprop -> KL path, and are marked as control steps everywhere.
- Timing table (seed 002's phases), memory table (peak RSS here; torch.cuda.max_memory_allocated on
  a GPU; parameter, adapter, optimizer and gradient bytes counted exactly).
- Time and memory per phase (generation / reward / reference / update): ``PhaseMeter`` charges RSS
  samples (and, on a GPU, the allocator's peak) to the phase running: the trainer's update phase through
  ``Trainer.around`` (rftlib.train.phases), the rest through wrappers this module puts on the trainer's
  parts only (engine.generate, ref.active, the reward).
- The sandbox under the load (code tasks): executions, executions/s, timeouts, crashes, reward share,
  from the metrics rows' ``sandbox/*`` (rftlib.train.step_metrics.sandbox_metrics).
- Success criteria, each measured and able to fail (``criteria_rows``): loss finite, rewards
  computed, KL small, weights changed *by the task reward* (control steps alone only warn), time and
  memory per phase, reward time against the seed's < 1 s.

Presets: ``seed002-fizzbuzz-rtx3080-cpu`` (SmolLM2-135M on sandboxed FizzBuzz-like code: the
validation of a model that can score) and ``seed002-fizzbuzz-rtx3080-tiny-cpu`` (the untrained tiny
model: a plumbing check, where the weights move only under control rewards).

Results are written to ``<run_dir>/validation.json`` and the per-step rows to logs/metrics.jsonl,
so the attempt appears in the index like any other.
"""

from __future__ import annotations

import ast
import hashlib
import math
import resource
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil
import torch

from rftlib.algo.advantages import compute_advantages
from rftlib.attempts import create_attempt, write_json
from rftlib.config import RunConfig, make_config
from rftlib.notebooks import preset_overrides
from rftlib.report import register_tasks
from rftlib.report.html import Html, esc, fmt, join, pre, status_badge, table
from rftlib.rewards.code import extract_code
from rftlib.rewards.math import extract_answer
from rftlib.rewards.registry import Reward, as_reward
from rftlib.train.loop import Trainer


@dataclass
class Check:
    component: str
    status: str  # pass | warn | fail | n/a
    evidence: str


@dataclass
class StepRecord:
    step: int
    control: bool  # rewards from the control reward, not the task's
    row: dict[str, Any]
    rewards: list[float]
    completions: list[str]
    diags: list[dict[str, float]]
    params_changed: int  # trainable tensors that changed in this step
    params_total: int
    max_abs_delta: float
    task_rewards: list[float] = field(default_factory=list)
    """the task's own component of each reward (a composite's ``reward/<first component>``); empty: ``rewards``"""

    @property
    def task_scores(self) -> list[float]:
        """Each row's task reward: what seed 002's criteria (in [0, 1], >= 0) judge; ``rewards`` is what the
        advantages were computed from (the composite's weighted sum when RunConfig.rewards names one)."""
        return self.task_rewards or self.rewards


@dataclass
class Validation:
    run_dir: Path
    device: str
    config: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    timing: list[tuple[str, float | None, str]] = field(default_factory=list)  # (phase, seconds, note)
    memory: list[tuple[str, float | None, str]] = field(default_factory=list)  # (item, bytes, note)
    steps: list[StepRecord] = field(default_factory=list)
    params: dict[str, int] = field(default_factory=dict)  # trainable / total
    controls: dict[str, Any] = field(default_factory=dict)
    phases: list[dict[str, Any]] = field(default_factory=list)  # per phase: seconds/step, share, peak RSS (GPU)
    sandbox: dict[str, float] = field(default_factory=dict)  # the code sandbox under the training load
    criteria: list[tuple[str, str, str, str]] = field(default_factory=list)  # seed 002's: (criterion, target, actual, status)

    @property
    def passed(self) -> bool:
        return all(c.status in ("pass", "n/a", "warn") for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        for s in d["steps"]:
            s["completions"] = s["completions"][:4]
            s["diags"] = s["diags"][:4]
        return d


# ---- control inputs -------------------------------------------------------------------------------
def _is_code(example) -> bool:
    return "problem" in (example.meta or {})


def control_example(task):
    """An example with a gold answer to build control completions from: a code problem with a
    reference solution (FizzBuzz when the task has it, seed 002's problem), else the first math one."""
    pool = [e for e in list(task.eval) + list(task.train[:200]) if e.answer]
    fizz = [e for e in pool if _is_code(e) and e.meta.get("entry_point") == "fizzbuzz"]
    return (fizz or pool or [task.eval[0]])[0]


def control_completions(example) -> tuple[str, str]:
    """(right, wrong) completions for the example, written as a model would."""
    if _is_code(example):
        entry = example.meta.get("entry_point") or example.meta["problem"].entry_point
        right = f"Here is the function.\n```python\n{example.answer.strip()}\n```"
        wrong = f"```python\ndef {entry}(*args):\n    return None\n```"
        return right, wrong
    return f"Working it out, the answer is \\boxed{{{example.answer}}}.", "The answer is \\boxed{not a number}."


def control_reward(text: str, example, truncated: bool) -> tuple[float, dict[str, float]]:
    """A deterministic coin flip on the completion text: different completions of a prompt get
    mixed 0/1 rewards, so advantages are non-zero whatever the model writes. Control only."""
    r = float(int(hashlib.md5(text.encode()).hexdigest(), 16) % 2)
    return r, {"correctness": r, "control_reward": 1.0}


# ---- helpers -------------------------------------------------------------------------------------
def _snapshot(model) -> dict[str, Any]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _delta(before: dict[str, Any], model) -> tuple[int, int, float]:
    changed, biggest = 0, 0.0
    params = dict(model.named_parameters())
    for n, t in before.items():
        d = float((params[n].detach() - t).abs().max()) if t.numel() else 0.0
        if d > 0:
            changed += 1
            biggest = max(biggest, d)
    return changed, len(before), biggest


def _bytes(tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def _optimizer_bytes(opt) -> int:
    return int(sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                   if isinstance(v, torch.Tensor)))


def _peak_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _rss() -> int | None:
    return int(psutil.Process().memory_info().rss)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return bool(code.strip())
    except (SyntaxError, ValueError):
        return False


def _rss_now() -> int:
    """This process's resident set size now (/proc/self/statm; 0 where there is no /proc)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


PHASES = ("generation", "reward", "reference", "update")
"""seed 002's per-step phases, in the order a step runs them"""


class PhaseMeter:
    """Peak memory per phase of a step: a thread samples this process's RSS every ``interval_s``
    and charges each sample to the phase running then (``with meter.phase("reward"): ...``);
    on a GPU, torch.cuda.max_memory_allocated is reset at each phase's start and read at its end.
    Peaks are over every occurrence of the phase in the run. RSS between samples can be missed:
    a peak shorter than ``interval_s`` (5 ms) reads low, never high."""

    def __init__(self, interval_s: float = 0.005, cuda: bool = False):
        self.interval_s, self.cuda = interval_s, cuda
        self.peak_rss: dict[str, int] = {}
        self.start_rss: dict[str, int] = {}  # RSS at the phase's first start
        self.peak_gpu: dict[str, int] = {}
        self._current: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rftlib-phase-meter", daemon=True)

    def __enter__(self) -> "PhaseMeter":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _charge(self, rss: int) -> None:
        ph = self._current
        if ph is not None and rss > self.peak_rss.get(ph, 0):
            self.peak_rss[ph] = rss

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._charge(_rss_now())

    @contextmanager
    def phase(self, name: str):
        outer, self._current = self._current, name
        rss = _rss_now()
        self.start_rss.setdefault(name, rss)
        self._charge(rss)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            self._charge(_rss_now())
            if self.cuda:
                self.peak_gpu[name] = max(self.peak_gpu.get(name, 0), int(torch.cuda.max_memory_allocated()))
            self._current = outer


def _metered(meter: PhaseMeter, name: str, fn: Callable) -> Callable:
    def wrapped(*a, **kw):
        with meter.phase(name):
            return fn(*a, **kw)
    return wrapped


def _meter_trainer(trainer, meter: PhaseMeter) -> Callable[[], None]:
    """Charge the trainer's phases to ``meter``: its update phase through ``trainer.around``
    (rftlib.train.phases), and, by wrapping them on this instance only, the engine's generate (every
    generation, the evals' too) and the reference's context; the reward is wrapped by the caller.
    Returns the function that undoes it."""
    engine, ref = trainer.engine, trainer.ref
    saved = [(engine, "generate", engine.__dict__.get("generate")), (ref, "active", ref.__dict__.get("active"))]
    engine.generate = _metered(meter, "generation", engine.generate)

    def around(phase: str):
        return meter.phase("update") if phase == "update" else nullcontext()
    trainer.around.append(around)
    ref_active = ref.active

    @contextmanager
    def active(*a, **kw):
        with meter.phase("reference"), ref_active(*a, **kw) as m:
            yield m
    ref.active = active

    def undo() -> None:
        trainer.around.remove(around)
        for obj, name, old in saved:
            if old is None:
                obj.__dict__.pop(name, None)
            else:
                setattr(obj, name, old)
    return undo


# ---- the run --------------------------------------------------------------------------------------
def run_validation(cfg: RunConfig, run_dir: str | Path | None = None, *, control_steps: int = 2,
                   log: Callable[[str], None] = print) -> Validation:
    """Run the validation attempt and return the filled tables (also written to validation.json)."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rss0 = _rss()
    run_dir = Path(run_dir) if run_dir is not None else create_attempt(cfg)
    t0 = time.time()
    trainer = Trainer(cfg, run_dir, progress=False)
    setup_s = time.time() - t0
    rss_loaded = _rss()
    model, G = trainer.model, cfg.n_samples_per_prompt
    dev = next(trainer.model.parameters()).device  # where the step really runs, not where it could
    name = f"{dev} ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else str(dev)
    v = Validation(run_dir=run_dir, device=name, config={k: getattr(trainer.cfg, k) for k in cfg.__dataclass_fields__})
    all_params = list(model.parameters())
    trainable = [p for p in all_params if p.requires_grad]
    v.params = {"trainable": sum(p.numel() for p in trainable), "total": sum(p.numel() for p in all_params)}
    log(f"[validate] {cfg.model} on {cfg.task}: trainable params: {v.params['trainable']:,} || all params: "
        f"{v.params['total']:,} || trainable%: {100 * v.params['trainable'] / max(v.params['total'], 1):.4f}")

    task_reward = trainer.task.reward  # the task's own: the control completions are judged by it
    training = trainer.training_reward()  # what the rollouts are scored with: a composite when cfg.rewards names one
    composite = trainer.reward is not None
    # the task's component of a composite's reward: reward/<its first component> (registry: the correctness reward
    # is listed first); without a composite the reward is the task's
    primary = f"reward/{next(iter(cfg.rewards))}" if composite else None
    record: list[tuple[str, float, dict]] = []
    meter = PhaseMeter(cuda=cuda)
    undo_meter = _meter_trainer(trainer, meter)

    def recording(fn) -> Reward:
        """``fn`` (a Reward, a composite, or a row function) recording every score, metered as the reward phase,
        scored as the trainer scores it (``Reward.score``: the batch form where there is one, so the sandbox
        scores a rollout in one map)."""
        base = as_reward(fn)

        def batch(texts, examples, truncated):
            out = base.score(texts, examples, truncated)
            record.extend((t, float(r), dict(d)) for t, (r, d) in zip(texts, out))
            return out

        def row(text, example, truncated):
            return batch([text], [example], [truncated])[0]
        return Reward(base.name, _metered(meter, "reward", row), _metered(meter, "reward", batch))

    def use_reward(reward: Reward) -> None:
        """Score the next step's rollouts with ``reward``: in place of the composite when there is one (the
        trainer reads it, not the task's), else of the task's reward."""
        if composite:
            trainer.reward = reward
        else:
            trainer.task.reward = reward

    def one_step(control: bool) -> StepRecord:
        record.clear()
        use_reward(recording(control_reward if control else training))
        before = _snapshot(model)
        row = trainer.step()
        row["validation/control_step"] = float(control)
        trainer.logger.log(row)
        changed, total, biggest = _delta(before, model)
        diags = [d for _, _, d in record]
        rec = StepRecord(step=row["step"], control=control, row=row, rewards=[r for _, r, _ in record],
                         completions=[t for t, _, _ in record], diags=diags,
                         params_changed=changed, params_total=total, max_abs_delta=biggest,
                         task_rewards=[float(d[primary]) for d in diags] if primary and not control else [])
        log(f"[validate] step {rec.step}{' (control reward)' if control else ''}: loss {row['loss']:.4f}, "
            f"reward {row['reward_mean']:.3f}, advantage_std {row['advantage_std']:.3g}, "
            f"kl {row.get('kl', float('nan')):.3g}, params changed {changed}/{total} (max |d| {biggest:.2e})")
        return rec

    try:
        with meter:
            for _ in range(cfg.num_steps):
                v.steps.append(one_step(control=False))
            if control_steps and not any(s.params_changed for s in v.steps):
                log(f"[validate] no task step changed the weights: {control_steps} control step(s) with a coin-flip reward")
                for _ in range(control_steps):
                    v.steps.append(one_step(control=True))
    finally:
        trainer.task.reward = task_reward
        if composite:
            trainer.reward = training
        undo_meter()
        trainer.close()

    ex = control_example(trainer.task)
    right, wrong = control_completions(ex)
    r_right, d_right = task_reward(right, ex, False)
    r_wrong, d_wrong = task_reward(wrong, ex, False)
    v.controls = {"example_id": ex.id, "right": right, "wrong": wrong, "reward_right": r_right, "reward_wrong": r_wrong,
                  "diag_right": d_right, "diag_wrong": d_wrong}
    v.checks = _checks(v, trainer.task, ex, compute_advantages)
    v.timing = _timing(v, trainer, setup_s)
    v.memory = _memory(v, trainer, rss0, rss_loaded, cuda)
    v.phases = phase_rows(v.steps, meter, v.config.get("max_staleness", 0))
    v.sandbox = sandbox_summary(v.steps)
    v.criteria = criteria_rows(v)
    write_json(run_dir / "validation.json", v.to_json())
    for c, target, actual, status in v.criteria:
        log(f"[validate] {status.upper():4s} {c}: {actual} (target {target})")
    return v


# ---- the three tables -----------------------------------------------------------------------------
def _checks(v: Validation, task, ex, compute_advantages) -> list[Check]:
    cfg, G = v.config, v.config["n_samples_per_prompt"]
    task_steps = [s for s in v.steps if not s.control]
    first = task_steps[0]
    texts = [t for s in task_steps for t in s.completions]
    out: list[Check] = []

    # Rollout
    nonempty = sum(bool(t.strip()) for t in texts)
    lens = [s.row["response_length_mean"] for s in task_steps]
    trunc = sum(s.row["truncated"] for s in task_steps) / len(task_steps)
    out.append(Check("Rollout", "pass" if texts and len(first.completions) == cfg["rollout_batch_size"] * G else "fail",
                     f"{len(texts)} completions over {len(task_steps)} steps ({cfg['rollout_batch_size']} prompts x G={G} "
                     f"per step); {nonempty} non-empty; mean length {sum(lens) / len(lens):.1f} tokens; "
                     f"truncated {100 * trunc:.0f}%; first: {texts[0][:80]!r}"))

    # Parseable output + extraction
    code = _is_code(ex)
    if code:
        entry = ex.meta.get("entry_point")
        fenced = sum(1 for t in texts if extract_code(t, entry)[1] != "raw")
        parses = sum(1 for t in texts if _parses(extract_code(t, entry)[0]))
        out.append(Check("Rollout output parseable", "pass" if parses else "warn",
                         f"{parses}/{len(texts)} completions hold Python that parses, {fenced}/{len(texts)} a code "
                         "fence" + ("" if parses else " (an untrained model writes no code: expected with the tiny model)")))
        got, rule = extract_code(v.controls["right"], entry)
        ok = got.strip() == ex.answer.strip() and rule == "python_fence"
        out.append(Check("Code extraction", "pass" if ok else "fail",
                         f"control: a ```python fenced reference solution of {ex.id} extracted by rule '{rule}', "
                         f"{'identical to' if ok else 'DIFFERENT from'} the reference; model completions: "
                         f"{fenced}/{len(texts)} fenced"))
        dr, dw = v.controls["diag_right"], v.controls["diag_wrong"]
        ok = dr.get("tests_passed") == dr.get("tests_total") and dr.get("tests_total", 0) > 0 and \
            dw.get("tests_passed", 0) < dw.get("tests_total", 0)
        out.append(Check("Test execution (sandbox)", "pass" if ok else "fail",
                         f"control: reference passes {dr.get('tests_passed', 0):.0f}/{dr.get('tests_total', 0):.0f} tests "
                         f"in the sandbox ({dr.get('exec_s', 0):.2f} s); a stub returning None passes "
                         f"{dw.get('tests_passed', 0):.0f}/{dw.get('tests_total', 0):.0f}"))
    else:
        parsed = sum(1 for t in texts if extract_answer(t)[0] is not None)
        boxed = sum(1 for t in texts if extract_answer(t)[1] == 2)
        out.append(Check("Rollout output parseable", "pass" if parsed else "warn",
                         f"{parsed}/{len(texts)} completions have an extractable answer, {boxed}/{len(texts)} a \\boxed{{}}"
                         + ("" if parsed else " (an untrained model: expected with the tiny model)")))
        got, method = extract_answer(v.controls["right"])
        ok = got == ex.answer and method == 2
        out.append(Check("Answer extraction", "pass" if ok else "fail",
                         f"control: '\\boxed{{{ex.answer}}}' extracted as {got!r} (method {method}: 2 = boxed)"))
        out.append(Check("Answer check", "pass" if v.controls["reward_right"] == 1.0 and v.controls["reward_wrong"] < 1.0
                         else "fail", f"control: the gold answer scores {v.controls['reward_right']}, a wrong one "
                                      f"{v.controls['reward_wrong']}"))

    # Reward computation / tensor
    rewards = [r for s in task_steps for r in s.task_scores]
    trained = [r for s in task_steps for r in s.rewards]
    in_range = all(0.0 <= r <= 1.0 and math.isfinite(r) for r in rewards)
    ctrl_ok = v.controls["reward_right"] == 1.0 and v.controls["reward_wrong"] < 1.0
    comp = cfg.get("rewards") or {}
    out.append(Check("Reward computation", "pass" if in_range and ctrl_ok and all(map(math.isfinite, trained)) else "fail",
                     f"{len(rewards)} task rewards, all in [0, 1]: {in_range}; values seen {sorted(set(rewards))[:6]}; "
                     f"mean {sum(rewards) / len(rewards):.3f}; control right/wrong: {v.controls['reward_right']}/"
                     f"{v.controls['reward_wrong']:.2f}"
                     + (f"; trained on the composite {' + '.join(f'{w:g}*{n}' for n, w in comp.items())}: values "
                        f"{sorted(set(round(r, 3) for r in trained))[:6]}" if comp else "")))
    t = torch.tensor(first.rewards)  # (N,) as the trainer builds it
    ok = t.shape == (cfg["rollout_batch_size"] * G,) and t.dtype == torch.float32 and bool(torch.isfinite(t).all())
    out.append(Check("Reward tensor", "pass" if ok else "fail",
                     f"step {first.step}: tensor({[round(x, 3) for x in t.tolist()][:8]}{'...' if t.numel() > 8 else ''}) "
                     f"shape {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"))

    # Advantages: recomputed from the recorded rewards and compared with what the trainer logged
    worst_mean, consistent, signal_steps = 0.0, True, []
    for s in v.steps:
        adv = compute_advantages(cfg["advantage_estimator"], torch.tensor(s.rewards), G, cfg["adv_eps"])  # (N,)
        worst_mean = max(worst_mean, float(adv.view(-1, G).mean(1).abs().max()))
        consistent &= abs(float(adv.std(correction=0)) - s.row["advantage_std"]) < 1e-5
        if float(adv.abs().max()) > 0:
            signal_steps.append(s.step)
    ok = worst_mean < 1e-5 and consistent
    no_sig = [s.step for s in task_steps if s.step not in signal_steps]
    out.append(Check("Advantage calculation", ("pass" if signal_steps else "warn") if ok else "fail",
                     f"{cfg['advantage_estimator']}: group means of the advantages <= {worst_mean:.1e} (zero-sum per "
                     f"group); recomputed std matches the logged advantage_std: {consistent}; non-zero advantages at "
                     f"steps {signal_steps or 'none'}"
                     + (f"; task steps {no_sig} had all-equal rewards in every group (no learning signal, "
                        "as seed 002's all-1.0 rewards)" if no_sig else "")))

    # KL
    if cfg["beta"] <= 0:
        out.append(Check("KL penalty", "n/a", "beta = 0: no KL term and no reference forward (seed 003's 120B setting)"))
    else:
        kls = [(s.step, s.row.get("kl")) for s in v.steps]
        changed_before = [s.step for s in v.steps if s.params_changed]
        after = [(st, k) for st, k in kls if changed_before and st > changed_before[0] and k is not None]
        at_start = kls[0][1]
        ok = at_start is not None and abs(at_start) < 1e-6 and any(k > 0 for _, k in after)
        out.append(Check("KL penalty", "pass" if ok else ("warn" if not after else "fail"),
                         f"{cfg['kl_estimator']}, beta {cfg['beta']}: kl = {fmt(at_start)} at step {kls[0][0]} (policy "
                         f"== reference before any update), then "
                         + (", ".join(f"{fmt(k)} at step {st}" for st, k in after[:3]) if after else
                            "no step after a weight change to measure it")
                         + ("; reference = the policy with the LoRA adapter disabled (no second copy)"
                            if cfg["lora_rank"] > 0 else "; reference = a frozen copy (full fine-tuning)")))

    # Backprop
    upd = [s for s in v.steps if s.params_changed]
    if upd:
        s = upd[0]
        out.append(Check("Backpropagation", "pass",
                         f"step {s.step}{' (control reward)' if s.control else ''}: {s.params_changed}/{s.params_total} "
                         f"trainable tensors changed, max |delta| {s.max_abs_delta:.2e}, grad_norm {s.row['grad_norm']:.3g}, "
                         f"lr {s.row['lr']:.2e}; trainable {v.params['trainable']:,} of {v.params['total']:,} params "
                         f"({100 * v.params['trainable'] / max(v.params['total'], 1):.2f}%)"))
    else:
        why = ", ".join(f"step {s.step}: grad_norm {s.row['grad_norm']:.3g}, lr {s.row['lr']:.2e}" for s in v.steps)
        out.append(Check("Backpropagation", "fail", f"no step changed a trainable parameter ({why})"))

    losses = [s.row["loss"] for s in v.steps]
    out.append(Check("Loss values", "pass" if all(math.isfinite(x) for x in losses) else "fail",
                     "loss per step: " + ", ".join(f"{x:.4f}" for x in losses) + " (no NaN/Inf)"))
    return out


def _timing(v: Validation, trainer, setup_s: float) -> list[tuple[str, float | None, str]]:
    steps = [s.row for s in v.steps]
    n = len(steps)

    def mean(k):
        return sum(r.get(k, 0.0) for r in steps) / max(n, 1)

    gen, total = mean("timing/generate"), mean("timing/step")
    ref_note = ("LoRA: the reference is the policy with the adapter disabled, nothing loaded" if v.config["lora_rank"] > 0
                else "full fine-tuning: a frozen deep copy, built during setup")
    return [
        ("Model loading (policy)", trainer.load_seconds, f"{v.config['model']} + LoRA r{v.config['lora_rank']}"),
        ("Setup (task, reference, optimizer)", setup_s - trainer.load_seconds, ref_note),
        ("Generation (per step)", gen, f"{v.config['rollout_batch_size']} x {v.config['n_samples_per_prompt']} samples x "
                                       f"<= {v.config['max_new_tokens']} tokens"),
        ("Reward computation (per step)", mean("timing/reward"), "extract + verify" +
         (" in the sandbox" if "tests_total" in (v.steps[0].diags[0] if v.steps[0].diags else {}) else "")),
        ("Reference logprobs (per step)", mean("timing/reference"),
         f"beta {v.config['beta']}: " + ("one no-grad forward of the reference" if v.config["beta"] > 0
                                         else "no reference forward")),
        ("Loss + backprop + optimizer (per step)", mean("timing/update"), "micro-batched, gradient accumulation"),
        ("Total per step", total, f"generation {100 * gen / total:.0f}% of it" if total else ""),
        (f"Total ({n} steps)", sum(r.get("timing/step", 0.0) for r in steps), "end-to-end, model load excluded"),
    ]


def _memory(v: Validation, trainer, rss0, rss_loaded, cuda: bool) -> list[tuple[str, float | None, str]]:
    model = trainer.model
    all_p = list(model.parameters())
    tr = [p for p in all_p if p.requires_grad]
    lora = v.config["lora_rank"] > 0
    rows: list[tuple[str, float | None, str]] = [
        ("Policy model weights", _bytes(all_p), f"{v.params['total']:,} params, {v.config['dtype']}"),
        ("Reference model", 0 if lora else _bytes(all_p),
         "adapter disabled: no second copy" if lora else "a frozen copy (full fine-tuning)"),
        ("LoRA adapters" if lora else "Trainable weights", _bytes(tr), f"{v.params['trainable']:,} params"),
        ("Optimizer states", _optimizer_bytes(trainer.optimizer), "AdamW: 2 moments per trainable param"),
        ("Gradients (at peak)", _bytes(tr), "one per trainable param; freed after each step"),
    ]
    if cuda:
        rows.append(("Peak GPU memory allocated", torch.cuda.max_memory_allocated(),
                     "torch.cuda.max_memory_allocated: weights + activations + KV cache"))
        rows.append(("Peak GPU memory reserved", torch.cuda.max_memory_reserved(), "the caching allocator's pool"))
    if rss0 is not None and rss_loaded is not None:
        rows.append(("Process RSS after model load", rss_loaded, f"+{(rss_loaded - rss0) / 2**20:.0f} MiB for the load"))
    rows.append(("Peak RSS (this process)", _peak_rss(), "getrusage ru_maxrss: includes the Python runtime and torch"))
    return rows


# ---- rendering ---------------------------------------------------------------------------------------
def component_table(v: Validation) -> Html:
    return table(["Component", "Status", "Evidence"],
                 [(esc(c.component), status_badge(c.status, {"pass": "WORKING"}.get(c.status)), esc(c.evidence))
                  for c in v.checks], row_status=[c.status for c in v.checks], raw=(0, 1, 2), cls="rft-validation",
                 caption="Component Validation (seed 002)")


def _mib(b: float | None) -> str:
    return "\u2014" if b is None else (f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB")


def timing_table(v: Validation) -> Html:
    """Seed 002's Timing Analysis, then time and memory per phase and the sandbox under the load."""
    return join(table(["Phase", "Duration", "Notes"], [(p, "\u2014" if s is None else f"{s:.2f} s", n)
                                                       for p, s, n in v.timing], cls="rft-timing", caption="Timing Analysis"),
                phase_table(v) if v.phases else "", sandbox_table(v))


def memory_table(v: Validation) -> Html:
    return table(["Item", "Size", "Notes"], [(i, _mib(b), n) for i, b, n in v.memory], cls="rft-memory",
                 caption=f"Memory Usage ({v.device})")


def steps_table(v: Validation) -> Html:
    rows = [(s.step, "control" if s.control else "task", s.row["loss"], s.row["reward_mean"], s.row.get("kl"),
             s.row["advantage_std"], s.row["grad_norm"], s.row["lr"], f"{s.params_changed}/{s.params_total}")
            for s in v.steps]
    return table(["Step", "Reward fn", "Loss", "Avg Reward", "KL", "advantage_std", "grad_norm", "lr", "tensors changed"],
                 rows, cls="rft-steps", caption="Metrics Summary")


def criteria_table(v: Validation) -> Html:
    """Seed 002's Success Criteria Evaluation, each criterion measured (``criteria_rows``)."""
    rows = v.criteria or criteria_rows(v)
    return table(["Criterion", "Target", "Actual", "Status"], [(a, b, c, status_badge(s)) for a, b, c, s in rows],
                 row_status=[r[3] for r in rows], raw=(3,), cls="rft-criteria", caption="Success Criteria Evaluation")


def phase_table(v: Validation) -> Html:
    """Time and memory per phase of a step (seed 002's Timing Analysis and Memory Usage, per phase)."""
    gpu = any(p.get("peak_gpu") is not None for p in v.phases)
    rows = [(p["phase"] + (" (producer thread, overlapped)" if p.get("overlapped") else ""),
             "\u2014" if p["seconds"] is None else f"{p['seconds']:.2f} s", pct_or_dash(p["share"]),
             _mib(p.get("peak_rss")), _mib(p.get("start_rss")), *((_mib(p.get("peak_gpu")),) if gpu else ()))
            for p in v.phases]
    return table(["Phase (per step)", "Time", "Share of step", "Peak RSS in phase", "RSS at first start",
                  *(("Peak GPU allocated",) if gpu else ())], rows, cls="rft-phases",
                 caption="Time and memory per phase (RSS sampled every 5 ms by PhaseMeter)")


def sandbox_table(v: Validation) -> Html:
    """The code sandbox under the training load: jobs, throughput, timeouts, crashes, reward share."""
    sb = v.sandbox
    if not sb:
        return table(["Sandbox"], [("no reward of this run went through the sandbox (not a code task)",)],
                     cls="rft-sandbox", caption="Sandbox under training load")
    rows = [("executions", f"{sb['executions']:.0f}", f"over {sb['steps']:.0f} task steps"),
            ("executions / s", f"{sb['executions_per_s']:.1f}", "jobs over the reward phase's wall time (extract + "
                                                                  "sandbox + scoring), per rank"),
            ("timeouts", f"{sb['timeouts']:.0f}", "jobs killed at the sandbox's wall clock"),
            ("crashes", f"{sb['crashes']:.0f}", "the program's process died (exit, signal, memory)"),
            ("sandbox errors", f"{sb['errors']:.0f}", "a worker broke (0 expected)"),
            ("reward time per step", f"{sb['reward_s_mean']:.2f} s (max {sb['reward_s_max']:.2f} s)",
             "seed 002 logged < 1 s"),
            ("reward share of step", pct_or_dash(sb["reward_share"]), "timing/reward_share, mean over task steps")]
    return table(["Sandbox", "Value", "Notes"], rows, cls="rft-sandbox", caption="Sandbox under training load")


def pct_or_dash(x: float | None) -> str:
    return "\u2014" if x is None else f"{100 * x:.1f}%"


PHASE_TIMING = {"generation": "timing/generate", "reward": "timing/reward", "reference": "timing/reference",
                "update": "timing/update"}
"""each phase's seconds in the trainer's metrics row"""


def phase_rows(steps: list[StepRecord], meter: PhaseMeter | None, max_staleness: int = 0) -> list[dict[str, Any]]:
    """Per phase: mean seconds per step, share of the mean step time, peak RSS while it ran (and
    the RSS at its first start), peak GPU memory allocated; then the rest of the step (sync,
    advantages, logging) and the whole step.

    At ``max_staleness`` > 0 a producer thread generates and scores the batches while the trainer updates
    (rftlib.train.pipeline): generation and reward are not on the step's path (their rows say ``overlapped``),
    the step waits only ``timing/wait_rollout`` for them (its own row), and the rest is the step less that
    wait, the reference pass and the update. Subtracting the producer's seconds from the step made it negative."""
    n = max(len(steps), 1)
    step_s = sum(s.row.get("timing/step", 0.0) for s in steps) / n
    threaded = max_staleness > 0
    out = []
    for ph in PHASES:
        sec = sum(s.row.get(PHASE_TIMING[ph], 0.0) for s in steps) / n
        out.append({"phase": ph, "seconds": sec, "share": sec / step_s if step_s else None,
                    "peak_rss": meter.peak_rss.get(ph) if meter else None,
                    "start_rss": meter.start_rss.get(ph) if meter else None,
                    "peak_gpu": meter.peak_gpu.get(ph) if meter and meter.cuda else None,
                    "overlapped": threaded and ph in ("generation", "reward")})
    on_path = [p["seconds"] for p in out if not p["overlapped"]]
    if threaded:
        wait = sum(s.row.get("timing/wait_rollout", 0.0) for s in steps) / n
        out.append({"phase": "waiting for the producer (generation + reward not overlapped)", "seconds": wait,
                    "share": wait / step_s if step_s else None})
        on_path.append(wait)
    rest = step_s - sum(on_path)
    out.append({"phase": "other (sync, advantages, metrics)", "seconds": rest, "share": rest / step_s if step_s else None})
    out.append({"phase": "whole step", "seconds": step_s, "share": 1.0 if step_s else None,
                "peak_rss": max(meter.peak_rss.values()) if meter and meter.peak_rss else None})
    return out


def sandbox_summary(steps: list[StepRecord]) -> dict[str, float]:
    """The sandbox's numbers over the task steps (the metrics rows' sandbox/* and timing/*); empty
    when no row went through the sandbox."""
    rows = [s.row for s in steps if not s.control and "sandbox/executions" in s.row]
    if not rows:
        return {}
    ex = sum(r["sandbox/executions"] for r in rows)
    rew = [r.get("timing/reward", 0.0) for r in rows]
    return {"steps": float(len(rows)), "executions": ex,
            "executions_per_s": ex / sum(rew) if sum(rew) > 0 else 0.0,
            "timeouts": sum(r.get("sandbox/timeouts", 0.0) for r in rows),
            "crashes": sum(r.get("sandbox/crashes", 0.0) for r in rows),
            "errors": sum(r.get("sandbox/errors", 0.0) for r in rows),
            "reward_s_mean": sum(rew) / len(rew), "reward_s_max": max(rew),
            "reward_share": sum(r.get("timing/reward_share", 0.0) for r in rows) / len(rows)}


KL_SMALL = 0.1
"""the largest per-token KL (nats, the logged estimator's batch mean) a validation run may reach: seed
002 estimated ~0.001-0.004 over its 5 steps; 0.1 is 25x that, and far past what a beta-0.04 penalty
holds on a run that is working (the policy has moved, not drifted away)"""
REWARD_TIME_S = 1.0
"""seed 002's reward time per step ("Reward Computation <1s"); above it the criterion warns"""


def criteria_rows(v: Validation) -> list[tuple[str, str, str, str]]:
    """Seed 002's success criteria, each measured: (criterion, target, actual, status pass|warn|fail).

    Weights changed passes only when a *task-reward* step changed them (control-reward steps prove
    the plumbing, not that the task reward trains: warn); no change at all fails."""
    task_steps = [s for s in v.steps if not s.control]
    losses = [s.row["loss"] for s in v.steps]
    rewards = [sum(s.task_scores) / max(len(s.task_scores), 1) for s in task_steps]  # the task reward's, not a composite's
    every = [r for s in task_steps for r in s.task_scores]
    n_rows = sum(len(s.completions) for s in task_steps)
    per_step = v.config["rollout_batch_size"] * v.config["n_samples_per_prompt"]
    peak = next((b for i, b, _ in v.memory if i.startswith("Peak GPU memory allocated")), None) or \
        next((b for i, b, _ in v.memory if i.startswith("Peak RSS")), None)
    out: list[tuple[str, str, str, str]] = []
    out.append(("Complete training loop", f"{v.config['num_steps']} task steps", f"{len(task_steps)} task steps"
                + (f" + {len(v.steps) - len(task_steps)} control" if len(v.steps) > len(task_steps) else ""),
                "pass" if len(task_steps) == v.config["num_steps"] else "fail"))
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    out.append(("Valid loss values", "finite at every step",
                (f"{min(losses):.4g} to {max(losses):.4g}" if finite else f"non-finite: {losses}") if losses else "none",
                "pass" if finite else "fail"))
    ok = n_rows == len(task_steps) * per_step and len(every) == n_rows and \
        all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in every)
    errs = v.sandbox.get("errors", 0.0) if v.sandbox else 0.0
    out.append(("Rewards computed", f"{per_step} per step, each task reward in [0, 1]"
                + (", no sandbox errors" if v.sandbox else ""),
                f"{len(every)} rewards for {n_rows} completions, mean {sum(every) / max(len(every), 1):.3f}, "
                f"values {sorted(set(round(r, 3) for r in every))[:6]}" + (f"; sandbox errors {errs:.0f}" if v.sandbox else ""),
                "pass" if ok and not errs else "fail"))
    out.append(("Stable rewards", ">= 0", ", ".join(f"{r:.2f}" for r in rewards),
                "pass" if rewards and all(r >= 0 for r in rewards) else "fail"))
    signal = [s.step for s in task_steps if s.row.get("advantage_std", 0.0) > 0]
    out.append(("Learning signal (task reward)", "non-zero advantages at some task step",
                f"steps {signal}" if signal else "every group's rewards equal at every task step",
                "pass" if signal else "warn"))
    if v.config["beta"] > 0:
        kls = [s.row.get("kl") for s in v.steps]
        meas = [k for k in kls if k is not None and math.isfinite(k)]
        ok = len(meas) == len(kls) and max(meas, default=0.0) < KL_SMALL
        # a step's KL is measured before its update: only steps after the first weight change see a moved policy
        first = next((i for i, s in enumerate(v.steps) if s.params_changed), None)
        moved = first is not None and first + 1 < len(v.steps)
        out.append(("KL small", f"< {KL_SMALL:g} nats/token (seed 002: ~0.001-0.004)",
                    ", ".join(fmt(k) for k in kls) + ("" if moved else
                                                      "; no step after a weight change measured it (policy == reference)"),
                    "fail" if not ok else ("pass" if moved else "warn")))
    else:
        out.append(("KL small", "beta > 0", "beta = 0: no KL term", "n/a"))
    task_changed = [s.step for s in task_steps if s.params_changed]
    ctrl_changed = [s.step for s in v.steps if s.control and s.params_changed]
    biggest = max((s.max_abs_delta for s in v.steps), default=0.0)
    out.append(("Weights changed", "by the task reward",
                f"task steps {task_changed} (max |delta| {biggest:.2e})" if task_changed else
                (f"only control-reward steps {ctrl_changed}: the plumbing updates, the task reward did not"
                 if ctrl_changed else "no step changed a trainable parameter"),
                "pass" if task_changed else ("warn" if ctrl_changed else "fail")))
    measured = [p for p in v.phases if p["phase"] in PHASES]
    ok = len(measured) == len(PHASES) and all(p["seconds"] is not None for p in measured)
    gen = next((p for p in v.phases if p["phase"] == "generation"), None)
    out.append(("Time per phase", "generation / reward / reference / update measured",
                "; ".join(f"{p['phase']} {p['seconds']:.2f} s ({pct_or_dash(p['share'])})" for p in measured)
                + (f"; generation is {pct_or_dash(gen['share'])} of the step (seed 002: 80%+)" if gen else ""),
                "pass" if ok else "fail"))
    have = [p for p in measured if p.get("peak_rss")]
    out.append(("Memory per phase", "peak RSS per phase, and the run's",
                "; ".join(f"{p['phase']} {_mib(p['peak_rss'])}" for p in have) + f"; peak {_mib(peak)}",
                "pass" if peak and len(have) == len(PHASES) - (v.config["beta"] <= 0) else "warn"))
    if v.sandbox:
        rs = v.sandbox["reward_s_mean"]
        out.append(("Reward time", f"< {REWARD_TIME_S:g} s per step (seed 002)",
                    f"{rs:.2f} s per step ({pct_or_dash(v.sandbox['reward_share'])} of the step), "
                    f"{v.sandbox['executions_per_s']:.1f} executions/s, {v.sandbox['timeouts']:.0f} timeouts, "
                    f"{v.sandbox['crashes']:.0f} crashes", "pass" if rs < REWARD_TIME_S else "warn"))
    out.append((f"Run on {v.device}", "Yes", f"Yes (peak {_mib(peak)})", "pass"))
    return out


def controls_block(v: Validation) -> Html:
    c = v.controls
    return join(f"<p>Control completions for <code>{esc(c['example_id'])}</code> (built from its gold answer): "
                f"right scores <b>{esc(c['reward_right'])}</b>, wrong scores <b>{esc(fmt(c['reward_wrong']))}</b>.</p>",
                table(["control", "completion"], [("right", pre(c["right"], 600)), ("wrong", pre(c["wrong"], 300))],
                      raw=(1,)))


def summary_text(v: Validation) -> str:
    bad = [c for c in v.checks if c.status == "fail"]
    warn = [c for c in v.checks if c.status == "warn"]
    s = (f"{len(v.checks) - len(bad) - len(warn)}/{len(v.checks)} components pass"
         + (f"; FAIL: {', '.join(c.component for c in bad)}" if bad else "")
         + (f"; warn: {', '.join(c.component for c in warn)}" if warn else ""))
    if any(x.control for x in v.steps):
        s += "; backprop/KL checked with control-reward steps (the task reward gave no learning signal)"
    return s


def start(preset: str, *, attempt_id: str | None = None, overrides: dict[str, Any] | None = None,
          **named: Any) -> tuple[RunConfig, Path]:
    """The validation attempt's config and run dir: the preset, then ``overrides`` and the named RunConfig fields
    (model, task, num_steps, beta, notes, runs_root) by the notebooks' one convention
    (rftlib.notebooks.preset_overrides): None keeps the preset's, any other value is used as given, so beta=0
    (seed 003's 120b setting) is beta 0 and num_steps=0 is asked for, not read as "keep the preset's"."""
    register_tasks()
    cfg = make_config(preset, preset_overrides(overrides, **named))
    return cfg, create_attempt(cfg, attempt_id or None)

