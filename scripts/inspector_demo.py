"""Write an inspector page (rftlib/report/inspect.py) from a synthetic but realistic view, for screenshots.

    .venv/bin/python scripts/inspector_demo.py /tmp/inspector-demo.html
    chromium --headless --screenshot=/tmp/inspector.png --window-size=1280,2000 \\
        "file:///tmp/inspector-demo.html#sort=spread&color=c&cf=gspo&open=0,1,7"

The view has the shape of a recorded off-policy step of the default preset replayed under gspo and
cispo: 8 groups x 8 completions of arithmetic word problems, with group 7's row 0 a 4,096-token
completion (a gpt-oss-like ramble) so the long-row collapse shows. The per-token quantities follow the
losses' closed forms (token-mean aggregation over N_tok tokens, advantage A, ratio r, eps 0.2):
ppo_clip c = -A r / N_tok, 0 where the clip is active on A's side; gspo c = -A s_i / (G_rows T_i) with
s_i the sequence's geometric-mean ratio; cispo c = -A min(r, 1 + eps_high) / N_tok (never 0).
No torch, no model: it only renders.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rftlib.report.inspect import write_page  # noqa: E402

WORDS = ("We need to compute the sum . First , add the tens : then the units . So the answer is "
         "Let me check again carefully because the carry matters here and we must not drop it").split()
EPS_LOW, EPS_HIGH = 0.2, 0.28
CONFIGS = ["recorded", "gspo", "cispo"]


def _pieces(rng: random.Random, n: int, answer: str) -> list[str]:
    out = ["<think>", "\n"]
    while len(out) < n - 6:
        w = rng.choice(WORDS)
        out.append(w if w in ",.:" else " " + w)
        if rng.random() < 0.04:
            out.append("\n\n" if rng.random() < 0.5 else "\n")
    out += ["</think>", "\n", " \\boxed{", answer, "}", "<|end|>"]
    return out[:n]


def demo_view(seed: int = 0, groups: int = 8, rows: int = 8, long_len: int = 4096) -> dict:
    """The demo's view dict (view33.md's interface)."""
    rng = random.Random(seed)
    lengths, specs = [], []
    for g in range(groups):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        for r in range(rows):
            n = long_len if (g == groups - 1 and r == 0) else rng.randint(18, 64)
            lengths.append(n)
            specs.append((g, r, a, b, n))
    n_tok = sum(lengths)
    out_groups = []
    for g in range(groups):
        g_specs = [s for s in specs if s[0] == g]
        a, b = g_specs[0][2], g_specs[0][3]
        answer = str(a + b)
        correct = [rng.random() < (0.5 if g % 3 else 0.9) for _ in g_specs]
        if g == 2:
            correct = [True] * rows  # a group with no spread: every advantage 0, nothing learned from it
        rewards = [(1.0 if c else 0.0) + (0.1 if rng.random() < 0.8 else 0.0) for c in correct]
        mu = sum(rewards) / rows
        sd = math.sqrt(sum((x - mu) ** 2 for x in rewards) / rows)
        out_rows = []
        for (gg, r, _, _, n), rew, ok in zip(g_specs, rewards, correct):
            adv = (rew - mu) / (sd + 1e-4)
            drift = 0.02 + 0.25 * rng.random() ** 3  # how stale the behaviour policy was for this row
            logr = [rng.gauss(0.0, drift) for _ in range(n)]
            if n > 1000:  # the long ramble: mostly confident tokens, a few surprising ones
                logr = [x * 0.2 if rng.random() < 0.995 else x * 6 for x in logr]
            ratio = [math.exp(x) for x in logr]
            seq = math.exp(sum(logr) / n)
            clip, c_rec, c_cis = [], [], []
            for x in ratio:
                lo, hi = x < 1 - EPS_LOW and adv < 0, x > 1 + EPS_HIGH and adv > 0
                clip.append(-1.0 if lo else 1.0 if hi else 0.0)
                c_rec.append(0.0 if (lo or hi) else -adv * x / n_tok)
                c_cis.append(-adv * min(x, 1 + EPS_HIGH) / n_tok)
            s_clip = 1.0 if (seq > 1 + 3e-4 and adv > 0) or (seq < 1 - 3e-4 and adv < 0) else 0.0
            c_gspo = [0.0 if s_clip else -adv * seq / (groups * rows * n)] * n
            entropy = [abs(rng.gauss(0.6, 0.5)) for _ in range(n)]
            gap = [-x + rng.gauss(0, 0.002) for x in logr]
            pieces = _pieces(rng, n, answer if ok else str(a + b + rng.choice((-10, 1, 10))))
            values = {"c/recorded": c_rec, "c/gspo": c_gspo, "c/cispo": c_cis,
                      "ratio/recorded": ratio, "ratio/gspo": [seq] * n, "ratio/cispo": ratio,
                      "clip/recorded": clip, "clip/gspo": [s_clip] * n, "clip/cispo": [0.0] * n,
                      "entropy": entropy, "gap": gap}
            totals = {}
            for cf in CONFIGS:
                cc, cl = values[f"c/{cf}"], values[f"clip/{cf}"]
                totals[f"sum c/{cf}"] = sum(cc)
                totals[f"clip_frac/{cf}"] = sum(1 for x in cl if x) / n
            out_rows.append({"row": g * rows + r, "rank": (g * rows + r) // (groups * rows // 2), "reward": rew,
                             "components": {"correct": 1.0 if ok else 0.0, "format_boxed": rew - (1.0 if ok else 0.0)},
                             "advantage": adv, "length": n, "truncated": n == long_len, "skipped": adv == 0,
                             "pieces": pieces, "values": values, "totals": totals})
        prompt = (f"A shop sells {a} apples in the morning and {b} apples in the afternoon. How many apples did it "
                  f"sell in total? Think step by step, then put the final answer in \\boxed{{}}.")
        out_groups.append({"group": g, "prompt": prompt, "answer": answer, "rows": out_rows})
    return {
        "schema": 1, "title": "attempt-07-offpolicy · step 4 (synthetic demo)", "attempt": "attempt-07-offpolicy",
        "step": 4,
        "header": {"policy version": 6, "optimizer steps": 2, "policy_loss": "ppo_clip", "eps_clip": "0.2 / 0.28",
                   "rows": groups * rows, "tokens": n_tok, "loss (recorded)": -0.01234, "grad_norm (recorded)": 0.8123},
        "verdict": {"faithful": True, "text": "FAITHFUL (bitwise; cpu float32, 2 threads) \u2014 synthetic demo data"},
        "configs": CONFIGS,
        "table": [{"config": "recorded", "policy_loss": "ppo_clip", "loss": -0.01234, "grad_norm": 0.8123, "cos_rec": 1.0,
                   "clip_low": 0.021, "clip_high": 0.034, "ratio_max": 2.31, "sum|c|": 0.3312},
                  {"config": "gspo", "policy_loss": "gspo", "loss": -0.01102, "grad_norm": 0.7340, "cos_rec": 0.912,
                   "clip_low": 0.094, "clip_high": 0.125, "ratio_max": 1.043, "sum|c|": 0.2871},
                  {"config": "cispo", "policy_loss": "cispo", "loss": -0.01301, "grad_norm": 0.8630, "cos_rec": 0.987,
                   "clip_low": 0.0, "clip_high": 0.034, "ratio_max": 2.31, "sum|c|": 0.3598}],
        "quantities": {
            "c": {"label": "gradient weight dL/dlogp", "scale": "diverging", "per_config": True},
            "ratio": {"label": "importance ratio pi/pi_old", "scale": "log1", "per_config": True},
            "clip": {"label": "clipped (-1 low, +1 high, 0 no)", "scale": "categorical", "per_config": True},
            "entropy": {"label": "entropy (nats)", "scale": "sequential", "per_config": False},
            "gap": {"label": "trainer - behaviour logprob", "scale": "diverging", "per_config": False}},
        "groups": out_groups,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the page to write (an .html path)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    args = ap.parse_args(argv)
    path = write_page(demo_view(args.seed), args.out, dtype=args.dtype)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB); open it with a fragment, e.g. "
          f"#sort=spread&color=c&cf=gspo&open=0,1,7")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
