"""Does anything accumulate over a long run? Per-step time and memory of one Trainer, with the census that finds it.

Runs ``Trainer.train()`` (the loop ``rft train`` runs: evals, checkpoints, metrics, TensorBoard, health
verdicts) on a preset for ``--steps`` steps and records, after every step (a callback on the metrics row):

- generation / update / whole-step seconds (the row's ``timing/*``); generation milliseconds per decode
  step (generate seconds / longest completion: the decode loop runs until the longest row stops); the share
  of rows the update ran (``skip_zero_advantage_rows`` leaves out rows whose advantage is 0, so the update's
  work follows the step's reward spread) and update milliseconds per row run: the update's constant-work figure;
- contention: seconds this process's threads waited for a CPU during the step (``rq_wait_s``, from
  /proc/self/task/*/schedstat; the machine is shared), system seconds and minor page faults;
- RSS now and the peak since the previous row (``/proc/self/status`` VmRSS, VmHWM reset after each row),
  the trainer's own ``memory/rss_gib`` (``row_rss_mib``, 0 where it is not logged), glibc's heap in use and
  free-but-held (``mallinfo2``, every arena: fragmentation shows as a growing free part);
- a census: Python objects the collector tracks, ``torch.Tensor`` objects alive and their unique storage
  bytes, and (``--types``) the object types whose count grew the most since the previous row.

``--fixed-length`` forces every completion to max_new_tokens (as bench/grpo_step.py does: min_new_tokens =
max_new_tokens in the sampling config), so every rollout does the same work and a slope in generation time
is growth, not longer completions. The first row is the step-0 eval (no step timings).

``--probe K``: K identical rollouts (fixed prompts, seeds and length) before step 1, after the last step,
and then in a fresh process that only loads the model. Growth inside the process shows as end > fresh =
start; a machine that got slower meanwhile (other work on shared cores) as end = fresh > start.

    flock /tmp/torch.lock .venv/bin/python bench/long_run_flat.py --preset default --steps 50 --fixed-length \\
        --probe 3 --out bench/results/long_run_after.json
    flock /tmp/torch.lock .venv/bin/python bench/long_run_flat.py --preset tiny --steps 20 --types

The summary compares the first and last fifths of the steps (medians) and fits a least-squares slope per
step to each column, so "flat" is a number: slope x steps against the step-to-step noise.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULT = "@@RESULT "  # the fresh-probe subprocess's result line
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_logprobs import _reset_peak_rss, _status_mb, child_env  # noqa: E402  (one peak-RSS reader for bench/)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_mib() -> dict[str, float]:
    """glibc's heap: bytes handed out (in use) and bytes free but still held (fragmentation), MiB; {} elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"heap_used_mib": (m.uordblks + m.hblkhd) / 2**20, "heap_free_mib": m.fordblks / 2**20}


def tensor_census() -> tuple[int, float]:
    """(torch.Tensor objects alive that the collector can see, MiB of their unique storages)."""
    import torch
    n, seen, nbytes = 0, set(), 0
    for o in gc.get_objects():
        try:
            if not isinstance(o, torch.Tensor):
                continue
        except ReferenceError:
            continue
        n += 1
        try:
            st = o.untyped_storage()
            key = st.data_ptr()
            if key not in seen and key != 0:
                seen.add(key)
                nbytes += st.nbytes()
        except (RuntimeError, NotImplementedError):  # meta / sparse / functional wrappers
            pass
    return n, nbytes / 2**20


def type_counts() -> Counter:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def force_fixed_length():
    """Every completion max_new_tokens long (EOS suppressed until then), rollouts and evals alike; returns
    the function that undoes it."""
    import rftlib.rollout.hf as hf
    orig = hf.sampling_config

    def forced(**kw):
        c = orig(**kw)
        c.min_new_tokens = kw["max_new_tokens"]
        return c

    hf.sampling_config = forced

    def restore() -> None:
        hf.sampling_config = orig

    return restore


def runqueue_wait_s() -> float:
    """Seconds this process's threads have spent runnable but waiting for a CPU (/proc/self/task/*/schedstat,
    2nd field): other processes on the machine. A step's share of it says how contested its timings are."""
    total = 0
    for d in Path("/proc/self/task").glob("*"):
        try:
            total += int((d / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def machine_calibration():
    """A function timing one fixed workload (ms, best of 3): the default model's LM head on 64 rows, fp32
    (64 x 576) @ (576 x 49152), the shape of a decode step's largest matmul. Machine-speed changes that the
    CPU-wait figure cannot see (other virtual machines on the host, memory bandwidth) move it; generation
    seconds divided by it (``gen_per_calib``) stay flat if that is all that changed."""
    import torch
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 576, generator=g), torch.randn(576, 49152, generator=g)

    def run() -> float:
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t)
        return 1e3 * best

    run()
    return run


def generation_probe(engine, tok, task, cfg, reps: int) -> list[float]:
    """Seconds of ``reps`` identical rollouts: the first B training prompts x G, forced to max_new_tokens,
    fixed seeds. The same call at the start and end of a long process and in a fresh one separates growth
    in the process (end > fresh = start) from the machine getting slower (end = fresh > start)."""
    import torch
    from rftlib.eval import format_prompts
    prompts = format_prompts(tok, task.train[:cfg.rollout_batch_size], task.system_prompt)
    undo = force_fixed_length()
    out = []
    try:
        for r in range(reps):
            torch.manual_seed(1000 + r)
            t = time.perf_counter()
            engine.generate(prompts, group_size=cfg.n_samples_per_prompt, max_new_tokens=cfg.max_new_tokens,
                            temperature=cfg.temperature, top_p=cfg.top_p)
            out.append(time.perf_counter() - t)
    finally:
        undo()
    return out


def fresh_probe(cfg, reps: int) -> list[float]:
    """The generation probe in a process that has done nothing else: the policy, task and engine as the
    trainer builds them (rftlib.train.build), no training."""
    from rftlib.train.build import build_policy, build_task
    from rftlib.train.dist import init_dist
    from rftlib.models.loading import compute_dtype
    from rftlib.rollout.hf import HFEngine
    model, tok = build_policy(cfg, init_dist(cfg))
    return generation_probe(HFEngine(model, tok, amp=compute_dtype(cfg.dtype, cfg.autocast)), tok, build_task(cfg),
                            cfg, reps)


def slope(ys: list[float]) -> float:
    """Least-squares slope of ys against 0..n-1 (per step)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, statistics.fmean(ys)
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


COLUMNS = [("step", "{:>4d}"), ("gen_s", "{:7.2f}"), ("gen_ms_tok", "{:9.1f}"), ("upd_s", "{:7.2f}"),
           ("step_s", "{:7.2f}"), ("len_mean", "{:8.1f}"), ("len_max", "{:7.0f}"), ("rows_run", "{:8.2f}"), ("upd_ms_row", "{:10.1f}"),
           ("sys_s", "{:6.1f}"), ("minflt_k", "{:8.0f}"), ("rq_wait_s", "{:9.1f}"), ("calib_ms", "{:8.1f}"), ("rss_mib", "{:8.0f}"), ("peak_mib", "{:9.0f}"),
           ("heap_used_mib", "{:9.0f}"), ("heap_free_mib", "{:9.0f}"), ("py_objects", "{:10d}"),
           ("tensors", "{:8d}"), ("tensor_mib", "{:10.1f}"), ("row_rss_mib", "{:11.0f}")]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="default")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--fixed-length", action="store_true", help="force max_new_tokens per completion (constant work)")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--types", action="store_true", help="print the object types that grew most each step")
    p.add_argument("--set", action="append", default=[], help="extra RunConfig override k=v (YAML value)")
    p.add_argument("--out", default=None, help="write the per-step rows as JSON here")
    p.add_argument("--calibrate", action="store_true",
                   help="after each step, time a fixed LM-head-shaped matmul: the machine's speed at that moment")
    p.add_argument("--probe", type=int, default=0,
                   help="generation probe reps before step 1, after the last step, and in a fresh process after")
    p.add_argument("--probe-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--table", nargs="+", metavar="JSON", help="print the per-step table of saved runs (--out files) "
                   "side by side as markdown, then exit (no torch)")
    args = p.parse_args(argv)
    if args.table:
        print(markdown_table(args.table))
        return {}

    import torch
    import yaml
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    from rftlib.config import make_config
    from rftlib.train.loop import Trainer
    if args.fixed_length and not args.probe_only:
        force_fixed_length()
    over = {"num_steps": args.steps, "seed": 0}  # report_to as the preset says (TensorBoard): part of a real run
    for kv in args.set:
        k, v = kv.split("=", 1)
        over[k] = yaml.safe_load(v)
    cfg = make_config(args.preset, over)
    if args.probe_only:
        print(RESULT + json.dumps(fresh_probe(cfg, args.probe)), flush=True)
        return {}
    run_dir = Path(tempfile.mkdtemp(prefix="long-run-flat-")) / "attempt"
    print(f"preset={args.preset} model={cfg.model} steps={args.steps} B={cfg.rollout_batch_size} "
          f"G={cfg.n_samples_per_prompt} max_new_tokens={cfg.max_new_tokens} fixed_length={args.fixed_length} "
          f"threads={args.threads} eval_steps={cfg.eval_steps} save_steps={cfg.save_steps} run_dir={run_dir}",
          flush=True)
    rows: list[dict] = []
    last_ru, last_wait = [resource.getrusage(resource.RUSAGE_SELF)], [runqueue_wait_s()]
    prev_types: list[Counter] = [type_counts()] if args.types else []
    print(" ".join(f"{name:>{len(fmt.format(0)) if 'd' in fmt else len(fmt.format(0.0))}s}" for name, fmt in COLUMNS),
          flush=True)

    calib = machine_calibration() if args.calibrate else None

    def record(row: dict) -> None:
        gc.collect()
        n_t, t_mib = tensor_census()
        gen = row.get("timing/generate", 0.0)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        run_frac = 1.0 - row.get("update/skipped_row_frac", 0.0)
        n_rows = cfg.rollout_batch_size * cfg.n_samples_per_prompt * cfg.num_updates_per_rollout
        T = row.get("response_length_max", 0.0)
        r = {"step": int(row.get("step", 0)), "gen_s": gen, "gen_ms_tok": 1e3 * gen / T if T else 0.0,
             "upd_s": row.get("timing/update", 0.0), "step_s": row.get("timing/step", 0.0),
             "eval_s": row.get("timing/eval", 0.0), "rows_run": run_frac,
             "upd_ms_row": 1e3 * row.get("timing/update", 0.0) / (run_frac * n_rows) if run_frac > 0 else None,
             "sys_s": ru.ru_stime - last_ru[0].ru_stime, "rq_wait_s": (wait := runqueue_wait_s()) - last_wait[0], "minflt_k": (ru.ru_minflt - last_ru[0].ru_minflt) / 1e3,
             "len_mean": row.get("response_length_mean", 0.0), "len_max": T,
             "rss_mib": _status_mb("VmRSS") or 0.0, "peak_mib": _status_mb("VmHWM") or 0.0, **malloc_mib(),
             "calib_ms": calib() if calib else None,
             "row_rss_mib": 1024 * row.get("memory/rss_gib", 0.0),  # the trainer's own figure (0: not logged)
             "py_objects": len(gc.get_objects()), "tensors": n_t, "tensor_mib": t_mib, "wall": time.time()}
        if r["calib_ms"] and gen:
            r["gen_per_calib"] = gen / (r["calib_ms"] / 1e3)  # generation in units of the fixed workload
        rows.append(r)
        print(" ".join(fmt.format(r.get(name) or 0) for name, fmt in COLUMNS), flush=True)
        if args.types:
            now = type_counts()
            grew = (now - prev_types[0]).most_common(8)
            prev_types[0] = now
            print("      grew: " + ", ".join(f"{k} +{v}" for k, v in grew), flush=True)
        last_ru[0], last_wait[0] = ru, wait
        _reset_peak_rss()  # the next row's peak is the next step's (and its eval / checkpoint)

    t0 = time.time()
    tr = Trainer(cfg, run_dir, progress=False, callbacks=[record])
    probes = {}
    try:
        if args.probe:
            probes["start"] = generation_probe(tr.engine, tr.tok, tr.task, cfg, args.probe)
            print(f"generation probe, start of this process: {_secs(probes['start'])}", flush=True)
            last_ru[0], last_wait[0] = resource.getrusage(resource.RUSAGE_SELF), runqueue_wait_s()
        tr.train()
        if args.probe:
            probes["end"] = generation_probe(tr.engine, tr.tok, tr.task, cfg, args.probe)
    finally:
        tr.close()
    if args.probe:
        del tr
        gc.collect()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--probe-only", "--probe", str(args.probe), "--preset",
               args.preset, "--threads", str(args.threads), *sum((["--set", kv] for kv in args.set), [])]
        lines = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=child_env()).stdout.splitlines()
        probes["fresh"] = next((json.loads(ln[len(RESULT):]) for ln in lines if ln.startswith(RESULT)), [])
        for k in ("start", "end", "fresh"):
            print(f"generation probe, {k:5s}: {_secs(probes[k])}", flush=True)
    print(f"\n{time.time() - t0:.0f} s in all")
    summary = summarize(rows, print)
    out = {"args": vars(args), "rows": rows, "summary": summary, "probes": probes, "cpu": _cpu_model(),
           "torch": torch.__version__}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"rows: {args.out}")
    return out


SUMMARY = ("gen_s", "gen_ms_tok", "calib_ms", "gen_per_calib", "upd_s", "rows_run", "upd_ms_row", "step_s", "sys_s", "minflt_k", "rq_wait_s",
           "rss_mib", "peak_mib", "row_rss_mib", "heap_used_mib", "heap_free_mib", "py_objects", "tensors", "tensor_mib")


def _value(r: dict, name: str) -> float | None:
    if name == "upd_ms_row" and not r.get("rows_run"):
        return None  # no row ran: no per-row figure
    return None if r.get(name) is None else float(r[name])


CONTESTED_S = 1.0
"""a step whose threads waited this long for a CPU ran beside other work: left out of the second summary"""


def summarize(rows: list[dict], say=lambda s: None) -> dict:
    """First vs last fifth of the steps (medians) and the least-squares slope per step of each column; then
    the same over the steps that waited under CONTESTED_S for a CPU (``uncontested``)."""
    steps = [r for r in rows if r["step"] > 0]
    out = _summary(steps, say)
    quiet = [r for r in steps if r.get("rq_wait_s", 0.0) < CONTESTED_S]
    if len(quiet) < len(steps):
        say(f"uncontested steps only (under {CONTESTED_S:g} s CPU wait: {len(quiet)} of {len(steps)}):")
        out["uncontested"] = _summary(quiet, say)
    return out


def _summary(steps: list[dict], say) -> dict:
    k = max(1, len(steps) // 5)
    say(f"{len(steps)} steps; first {k} vs last {k} steps (medians), slope per step x {len(steps)} steps:")
    out = {}
    for name in SUMMARY:
        ys = [y for r in steps if (y := _value(r, name)) is not None]
        if not ys:
            continue
        a, b, s = statistics.median(ys[:k]), statistics.median(ys[-k:]), slope(ys)
        out[name] = {"first": a, "last": b, "slope_per_step": s, "over_run": s * len(ys)}
        say(f"  {name:14s} {a:10.2f} -> {b:10.2f}   slope {s:+9.4f}/step  ({s * len(ys):+.2f} over the run)")
    return out


TABLE = (("len_mean", "length mean", "{:.1f}"), ("len_max", "max", "{:.0f}"), ("gen_s", "gen s", "{:.2f}"), ("upd_s", "update s", "{:.2f}"), ("rows_run", "rows run", "{:.2f}"),
         ("upd_ms_row", "update ms/row", "{:.0f}"), ("step_s", "total s", "{:.2f}"), ("rq_wait_s", "CPU wait s", "{:.1f}"), ("calib_ms", "calib ms", "{:.1f}"),
         ("rss_mib", "RSS MiB", "{:.0f}"), ("peak_mib", "step peak MiB", "{:.0f}"))


def markdown_table(paths: list[str]) -> str:
    """Per-step rows of saved runs side by side (one column group per file), then each run's summary."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    names = [Path(p).stem for p in paths]
    head = ["step"] + [f"{n}: {label}" for n in names for _, label, _ in TABLE]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    by_step = [{r["step"]: r for r in run["rows"] if r["step"] > 0} for run in runs]
    for step in sorted(set().union(*by_step)):
        cells = [str(step)]
        for rows in by_step:
            r = rows.get(step)
            cells += [fmt.format(v) if r and (v := _value(r, k)) is not None else "" for k, _, fmt in TABLE]
        lines.append("| " + " | ".join(cells) + " |")
    for n, run in zip(names, runs):
        lines.append(f"\n{n} (CPU: {run.get('cpu', '?')}, torch {run.get('torch', '?')}):")
        summarize(run["rows"], lines.append)
        for k, xs in run.get("probes", {}).items():
            lines.append(f"  generation probe, {k:5s}: {_secs(xs)}")
    return "\n".join(lines)


def _secs(xs: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in xs) + (f" s (median {statistics.median(xs):.2f})" if xs else "(none)")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    main()
