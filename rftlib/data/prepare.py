"""Seed 003's data preparation (sec. 8): filter, deduplicate and split a NuminaMath-style table.

    python -m rftlib.data.prepare INPUT --out DIR --rl-pool-size N --sft-size N --seed 42 [--ood FILE]

INPUT (.jsonl, .jsonl.gz, or .parquet when pyarrow is installed) has NuminaMath-1.5's columns
``problem, solution, answer, problem_type, question_type, source, synthetic`` (optional
``problem_is_valid`` / ``solution_is_valid``, "yes"/"no", are honoured). Stages, in the seed's order;
each row removed is counted against the first stage that removes it:

    1. question_type == "math-word-problem"
    2. clean integer answer: ``normalize_answer(answer)`` is ``-?\\d+`` ("$42$", "1,000", "007" are;
       "3.5", "\\frac{1}{2}", "x=4" are not); the label is that integer
    3. exclude AMC/AIME sources (``source`` containing "amc" or "aime", any case): they are evals
    4. valid problem and solution: non-blank strings, and the validity flags not "no"
    5. dedup by MD5 of the normalised problem (whitespace collapsed; case kept): first one wins
    6. too short: problem < MIN_PROBLEM_CHARS or solution < MIN_SOLUTION_CHARS characters

Splits are deterministic given ``--seed``: rows are put in MD5 order (so the input's row order does
not matter), shuffled, then dealt out: eval, SFT dev, SFT train (these two only from rows whose
solution has a \\boxed{} equal to the label, as SFT teaches that format), RL pool (``all`` = the
rest). The ID probe is sampled from the RL pool (a subset, as in the seed); the OOD probe from
``--ood``, filtered by the same stages and by hash disjoint from every main-input problem.
Outputs, in the seed's format: RL pool and probes ``{"input", "label"}``, SFT ``{"input",
"output", "label"}``; ``data_card.md`` / ``data_card.json`` with the count after each stage and
the overlap proof, recomputed from the written files.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from rftlib.data.base import Example, Task, append_instruction, problem_hash  # noqa: F401 (problem_hash: re-export)
from rftlib.data.benchmarks import MATH_INSTRUCTION, gsm8k_solution_to_boxed, to_numina  # noqa: F401 (re-export)
from rftlib.data.jsonl import DataError, iter_jsonl, read_jsonl, read_table, write_jsonl
from rftlib.rewards.math import answers_match, math_task_reward, normalize_answer, parse_gold

NUMINA_COLUMNS = ("problem", "solution", "answer", "problem_type", "question_type", "source", "synthetic")
MIN_PROBLEM_CHARS = 20  # shorter "problems" are fragments ("1+1=?"), not word problems
MIN_SOLUTION_CHARS = 20  # a solution shorter than this is a bare answer, useless for SFT
EXCLUDED_SOURCES = ("amc", "aime")  # seed 003: AMC/AIME are the held-out evals
SPLITS = ("eval", "sft_dev", "sft_train", "sft_rl_pool")  # dealt out in this order
FILES = {"eval": "eval.jsonl", "sft_dev": "sft_dev.jsonl", "sft_train": "sft_train.jsonl",
         "sft_rl_pool": "sft_rl_pool.jsonl"}  # seed 003's names
_INT = re.compile(r"-?\d+")


def clean_integer(answer) -> str | None:
    """The answer as a canonical integer string ("-7", "1000"), or None if it is not one."""
    if isinstance(answer, bool) or answer is None:
        return None
    s = normalize_answer(str(answer))
    return str(int(s)) if _INT.fullmatch(s) else None


def _valid_text(v) -> bool:
    return isinstance(v, str) and bool(v.strip())


@dataclass(frozen=True)
class Stage:
    name: str
    purpose: str
    keep: Callable[[dict], bool]


STAGES = (
    Stage('question_type == "math-word-problem"', "focus on solvable word problems",
          lambda r: r["question_type"] == "math-word-problem"),
    Stage("clean integer answer", "exact-match reward with no ambiguity",
          lambda r: clean_integer(r["answer"]) is not None),
    Stage("exclude AMC/AIME sources", "keep the eval sets out of training",
          lambda r: not any(s in str(r["source"]).lower() for s in EXCLUDED_SOURCES)),
    Stage("valid problem + solution", "filter garbage/empty entries",
          lambda r: _valid_text(r["problem"]) and _valid_text(r["solution"])
          and str(r.get("problem_is_valid", "yes")).lower() != "no"
          and str(r.get("solution_is_valid", "yes")).lower() != "no"),
    # stage 5, dedup, is stateful: see filter_rows
    Stage("remove too-short problem or solution",
          f"quality filter (problem >= {MIN_PROBLEM_CHARS}, solution >= {MIN_SOLUTION_CHARS} chars)",
          lambda r: len(r["problem"].strip()) >= MIN_PROBLEM_CHARS
          and len(r["solution"].strip()) >= MIN_SOLUTION_CHARS),
)
DEDUP = "deduplicate by problem hash (MD5)"


@dataclass
class Filtered:
    """Rows that passed every stage (each with ``_hash`` and ``_label``) and the count after each stage."""

    rows: list[dict]
    stages: list[dict] = field(default_factory=list)
    """[{"stage", "remaining", "removed", "purpose"}], starting with "start" """


def filter_rows(rows: list[dict], start_label: str = "start") -> Filtered:
    """Apply the six stages in order; every removal is counted against its stage."""
    counts = [{"stage": start_label, "remaining": len(rows), "removed": 0, "purpose": "input rows"}]

    def record(name: str, purpose: str, kept: list[dict], before: int) -> list[dict]:
        counts.append({"stage": name, "remaining": len(kept), "removed": before - len(kept), "purpose": purpose})
        return kept

    cur = rows
    for stage in STAGES[:4]:
        cur = record(stage.name, stage.purpose, [r for r in cur if stage.keep(r)], len(cur))
    seen: set[str] = set()
    deduped = []
    for r in cur:
        h = problem_hash(r["problem"])
        if h not in seen:
            seen.add(h)
            deduped.append({**r, "_hash": h, "_label": clean_integer(r["answer"])})
    cur = record(DEDUP, "prevent memorising repeated problems", deduped, len(cur))
    last = STAGES[4]
    cur = record(last.name, last.purpose, [r for r in cur if last.keep(r)], len(cur))
    return Filtered(cur, counts)


def sft_ready(row: dict) -> bool:
    """The solution ends its reasoning in a \\boxed{} equal to the label (what SFT should teach)."""
    sol = row["solution"]
    return ("\\boxed" in sol or "\\fbox" in sol) and answers_match(parse_gold(sol), row["_label"])


def _take(rows: Iterable[dict], n: int | None, taken: set[str], pred=lambda r: True) -> list[dict]:
    out = []
    for r in rows:
        if n is not None and len(out) >= n:
            break
        if r["_hash"] not in taken and pred(r):
            out.append(r)
            taken.add(r["_hash"])
    return out


def split_rows(rows: list[dict], sizes: dict[str, int | None], seed: int) -> dict[str, list[dict]]:
    """Deal the filtered rows into SPLITS (``sizes[split]``; None for sft_rl_pool = all the rest).
    Deterministic: MD5 order, then a shuffle by ``seed``. DataError if a split cannot be filled."""
    order = sorted(rows, key=lambda r: r["_hash"])
    random.Random(seed).shuffle(order)
    taken: set[str] = set()
    out = {}
    for name in SPLITS:
        want = sizes[name]
        pred = sft_ready if name.startswith("sft_") and name != "sft_rl_pool" else (lambda r: True)
        out[name] = _take(order, want, taken, pred)
        if want is not None and len(out[name]) < want:
            avail = len(out[name])
            raise DataError(f"{name}: asked for {want} rows but only {avail} are left after the earlier splits"
                            + (" (SFT rows need a \\boxed{} solution equal to the label)" if pred is sft_ready else "")
                            + f"; {len(rows)} rows passed the filters")
    return out


def rl_row(r: dict) -> dict:
    return {"input": r["problem"], "label": r["_label"]}


def sft_row(r: dict) -> dict:
    return {"input": r["problem"], "output": r["solution"], "label": r["_label"]}


def file_hashes(path: Path) -> list[str]:
    """problem_hash of every row's "input" in a written split file."""
    return [problem_hash(r["input"]) for r in read_jsonl(path, required=["input", "label"])]


def overlap_proof(files: dict[str, Path], subset_ok: dict[str, str] | None = None) -> dict:
    """Pairwise intersections of the files' problem-hash sets, recomputed from disk.

    subset_ok: {split: parent} pairs that overlap by design (the ID probe is drawn from the RL
    pool); for those the proof states that the split is a subset of its parent instead.
    """
    subset_ok = subset_ok or {}
    hashes = {name: file_hashes(p) for name, p in files.items()}
    sets = {name: set(h) for name, h in hashes.items()}
    pairs, ok = [], True
    for a, b in itertools.combinations(files, 2):
        n = len(sets[a] & sets[b])
        by_design = subset_ok.get(a) == b or subset_ok.get(b) == a
        pairs.append({"a": a, "b": b, "shared": n, "by_design": by_design})
        ok &= by_design or n == 0
    per_file = {name: {"rows": len(h), "unique_hashes": len(sets[name]),
                       "digest": hashlib.sha256("\n".join(sorted(sets[name])).encode()).hexdigest()}
                for name, h in hashes.items()}
    subsets = {child: sets[child] <= sets[parent] for child, parent in subset_ok.items()}
    ok &= all(subsets.values()) and all(v["rows"] == v["unique_hashes"] for v in per_file.values())
    return {"zero_overlap": ok, "pairs": pairs, "files": per_file, "subsets": subsets}


def prepare(input_path: str | Path, out_dir: str | Path, *, rl_pool_size: int | None, sft_size: int,
            sft_dev_size: int = 500, eval_size: int = 500, probe_size: int = 200, seed: int = 42,
            ood_path: str | Path | None = None) -> dict:
    """Run the whole pipeline; returns the data card (also written to out_dir)."""
    out = Path(out_dir)
    rows = read_table(input_path, required=NUMINA_COLUMNS)
    main = filter_rows(rows)
    sizes = {"eval": eval_size, "sft_dev": sft_dev_size, "sft_train": sft_size, "sft_rl_pool": rl_pool_size}
    for k, v in sizes.items():
        if v is not None and v < 0:
            raise ValueError(f"{k} size must be >= 0, got {v}")
    splits = split_rows(main.rows, sizes, seed)
    files = {name: out / FILES[name] for name in SPLITS}
    for name in SPLITS:
        write_jsonl(files[name], [sft_row(r) if name in ("sft_train", "sft_dev") else rl_row(r) for r in splits[name]])

    pool = sorted(splits["sft_rl_pool"], key=lambda r: r["_hash"])
    id_probe = random.Random(seed).sample(pool, min(probe_size, len(pool)))
    id_name = f"probe_set_{probe_size}"
    files[id_name] = out / f"{id_name}.jsonl"
    write_jsonl(files[id_name], [rl_row(r) for r in id_probe])

    card: dict = {"input": str(input_path), "ood": str(ood_path) if ood_path else None, "seed": seed,
                  "sizes_requested": {**sizes, "probe": probe_size},
                  "min_chars": {"problem": MIN_PROBLEM_CHARS, "solution": MIN_SOLUTION_CHARS},
                  "stages": main.stages}
    assigned = sum(len(v) for v in splits.values())
    card["unassigned_after_filters"] = len(main.rows) - assigned
    card["sft_ready_rows"] = sum(map(sft_ready, main.rows))
    subset_ok = {id_name: "sft_rl_pool"}
    if ood_path is not None:
        ood_rows = read_table(ood_path, required=NUMINA_COLUMNS)
        ood = filter_rows(ood_rows)
        main_hashes = {r["_hash"] for r in main.rows}
        disjoint = [r for r in ood.rows if r["_hash"] not in main_hashes]
        ood.stages.append({"stage": "not in the main input (problem hash)", "remaining": len(disjoint),
                           "removed": len(ood.rows) - len(disjoint), "purpose": "out-of-distribution by construction"})
        disjoint.sort(key=lambda r: r["_hash"])
        ood_probe = random.Random(seed).sample(disjoint, min(probe_size, len(disjoint)))
        ood_name = f"probe_set_{probe_size}_ood"
        files[ood_name] = out / f"{ood_name}.jsonl"
        write_jsonl(files[ood_name], [rl_row(r) for r in ood_probe])
        card["ood_stages"] = ood.stages
    card["splits"] = {name: {"file": p.name, "rows": 0} for name, p in files.items()}
    proof = overlap_proof(files, subset_ok)
    for name in files:
        card["splits"][name]["rows"] = proof["files"][name]["rows"]
    card["sources"] = {name: dict(Counter(str(r["source"]) for r in splits[name])) for name in SPLITS}
    card["overlap"] = proof
    (out / "data_card.json").write_text(json.dumps(card, indent=2) + "\n")
    (out / "data_card.md").write_text(card_markdown(card))
    return card


def _stage_line(s: dict) -> str:
    return f"| {s['stage']} | {s['remaining']:,} | {s['removed']:,} | {s['purpose']} |"


def card_markdown(card: dict) -> str:
    """The data card as markdown tables, laid out like seed 003 sec. 8."""
    lines = ["# Data card", "", f"Input: `{card['input']}`  ", f"OOD source: `{card['ood']}`  ",
             f"Seed: {card['seed']}", "", "## Filter pipeline", "",
             "| Filter stage | Remaining | Removed | Purpose |", "|---|---:|---:|---|"]
    lines += [_stage_line(s) for s in card["stages"]]
    if card.get("ood_stages"):
        lines += ["", "### OOD source", "", "| Filter stage | Remaining | Removed | Purpose |", "|---|---:|---:|---|"]
        lines += [_stage_line(s) for s in card["ood_stages"]]
    lines += ["", f"Rows past the filters but in no split: {card['unassigned_after_filters']:,}; "
              f"rows with a \\boxed{{}} solution equal to the label (SFT-eligible): {card['sft_ready_rows']:,}.",
              "", "## Splits", "", "| File | Rows | Unique hashes | SHA-256 of sorted problem hashes |",
              "|---|---:|---:|---|"]
    for name, s in card["splits"].items():
        f = card["overlap"]["files"][name]
        lines.append(f"| `{s['file']}` | {s['rows']:,} | {f['unique_hashes']:,} | `{f['digest'][:16]}…` |")
    lines += ["", "Sources per split: " + "; ".join(
        f"{name} " + ", ".join(f"{src} {n:,}" for src, n in sorted(c.items())) for name, c in card["sources"].items())]
    proof = card["overlap"]
    lines += ["", "## Overlap proof (recomputed from the written files)", "",
              f"Zero overlap: **{'yes' if proof['zero_overlap'] else 'NO'}**", "",
              "| A | B | Shared problems |", "|---|---|---:|"]
    for p in proof["pairs"]:
        note = " (subset by design)" if p["by_design"] else ""
        lines.append(f"| {p['a']} | {p['b']} | {p['shared']}{note} |")
    for child, ok in proof["subsets"].items():
        lines.append(f"\n`{child}` is a subset of the RL pool: {'yes' if ok else 'NO'}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the prepared files as a task


def rl_input(row: dict, where: str) -> str:
    """An RL row's ``input``: non-empty text, else DataError at ``where`` (``path:line``)."""
    v = row["input"]
    if not isinstance(v, str) or not v.strip():
        raise DataError(f"{where}: 'input' must be non-empty text (the problem), got {type(v).__name__} {v!r:.60}")
    return v


def rl_label(row: dict, where: str) -> str:
    """An RL row's ``label`` as the gold answer text: a non-empty string or a number (never
    ``"None"`` from a null label, never ``"True"`` from a boolean), else DataError at ``where``."""
    v = row["label"]
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or not str(v).strip():
        raise DataError(f"{where}: 'label' must be the answer as a non-empty string or a number, "
                        f"got {type(v).__name__} {v!r:.60}")
    return str(v)


def prepared_task(data_dir: str, eval_file: str = FILES["eval"], instruction: str | None = None,
                  reward_mode: str = "exact") -> Task:
    """Train on ``<data_dir>/sft_rl_pool.jsonl``, evaluate on ``eval_file``; the probe files
    become probes "id" (probe_set_N.jsonl) and "ood" (probe_set_N_ood.jsonl) when present.
    ``instruction`` (default benchmarks.MATH_INSTRUCTION) is appended to every prompt (the task's
    ``instruction``: SFT rows of ``sft_train.jsonl``, bare problems, get it too; rftlib.sft). Reward:
    seed 003's exact match, or math-verify equivalence with ``reward_mode`` math_verify. A row
    whose input is not text, or whose label is null, empty or not a string/number, is a DataError
    naming the file and line."""
    d = Path(data_dir)
    instr = (MATH_INSTRUCTION if instruction is None else instruction).rstrip()

    def load(path: Path) -> list[Example]:
        return [Example(id=f"{path.stem}/{i}", prompt=append_instruction(rl_input(r, f"{path}:{n}"), instr, "\n"),
                        answer=rl_label(r, f"{path}:{n}"))
                for i, (n, r) in enumerate(iter_jsonl(path, required=["input", "label"]))]

    probes = {}
    for p in sorted(d.glob("probe_set_*.jsonl")):
        probes["ood" if p.stem.endswith("_ood") else "id"] = load(p)
    return Task(name="prepared", train=load(d / FILES["sft_rl_pool"]), eval=load(d / eval_file),
                reward=math_task_reward(reward_mode), probes=probes, instruction=instr, instruction_sep="\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rftlib.data.prepare", description=__doc__.split("\n")[0])
    ap.add_argument("input", help="jsonl / jsonl.gz / parquet with NuminaMath-1.5's columns")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--rl-pool-size", required=True, help="RL pool rows, or 'all' for every remaining row")
    ap.add_argument("--sft-size", type=int, required=True, help="SFT train rows (seed 003: 5000)")
    ap.add_argument("--sft-dev-size", type=int, default=500, help="SFT dev rows (seed 003: 500)")
    ap.add_argument("--eval-size", type=int, default=500, help="held-out eval rows from the same distribution")
    ap.add_argument("--probe-size", type=int, default=200, help="ID and OOD probe rows (seed 003: 200)")
    ap.add_argument("--seed", type=int, default=42, help="split and probe seed (seed 003: 42)")
    ap.add_argument("--ood", help="a second NuminaMath-style file to draw the OOD probe from")
    a = ap.parse_args(argv)
    rl = None if a.rl_pool_size == "all" else int(a.rl_pool_size)
    card = prepare(a.input, a.out, rl_pool_size=rl, sft_size=a.sft_size, sft_dev_size=a.sft_dev_size,
                   eval_size=a.eval_size, probe_size=a.probe_size, seed=a.seed, ood_path=a.ood)
    print(card_markdown(card))
    return 0 if card["overlap"]["zero_overlap"] else 1


if __name__ == "__main__":
    sys.exit(main())
