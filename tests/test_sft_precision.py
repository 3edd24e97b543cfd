"""One precision rule for every eval, the SFT stage's included, shown beside every number.

SFT's evals ignored ``eval_dtype`` (they ran in whatever autocast the stage trained under) and resolved the
dtype as if on a CPU: ``auto`` became float32 on any machine and ``dtype: float16`` was refused even with
``device: cuda``; the RL report showed the SFT parent's before/after beside its own baseline without a
precision label.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from rftlib.attempts import create_attempt
from rftlib.config import make_config
from rftlib.report.attempt import load_attempt
from rftlib.report.index import parent_html

pytest.importorskip("trl")
from rftlib import sft  # noqa: E402  (needs trl)


def test_the_rule_on_each_device(monkeypatch):
    from rftlib.eval import eval_dtypes

    cpu, gpu = torch.device("cpu"), torch.device("cuda:0")
    assert eval_dtypes("auto", "auto", cpu) == ("float32", "float32")
    assert eval_dtypes("auto", "bfloat16", cpu) == ("float32", "bfloat16")
    assert eval_dtypes("bfloat16", "auto", cpu) == ("bfloat16", "bfloat16")
    with pytest.raises(ValueError, match="float16 needs a CUDA device"):
        eval_dtypes("float16", "auto", cpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert eval_dtypes("auto", "auto", gpu) == ("bfloat16", "bfloat16")
    assert eval_dtypes("float16", "auto", gpu) == ("float16", "float16")
    assert eval_dtypes("auto", "float32", gpu) == ("bfloat16", "float32")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # a V100: no bf16
    assert eval_dtypes("auto", "auto", gpu) == ("float32", "float32")


@pytest.mark.parametrize("eval_dtype", ["auto", "bfloat16"])
def test_sft_evals_compute_in_the_rules_precision_not_the_training_autocast(tmp_path, eval_dtype):
    """autocast bf16 trains the SFT stage under bf16; its before/after evals still compute in eval_dtype's
    precision (auto: the weights' float32 on this CPU), and every record says which."""
    cfg = make_config("sft-tiny", {"runs_root": str(tmp_path / "runs"), "num_steps": 1, "autocast": "bf16",
                                   "eval_dtype": eval_dtype})
    want = "float32" if eval_dtype == "auto" else eval_dtype  # auto on a CPU: the weights' float32
    summary = sft.run_sft(cfg, write=lambda s: None)
    run_dir = load_attempt(summary["run_dir"]).run_dir
    for step in (0, 1):
        assert json.loads((run_dir / "eval" / f"step_{step}.json").read_text())["precision"] == want
    assert summary["eval_precision"] == want
    assert f"({want})" in sft.sft_result_text(summary)


@pytest.mark.parametrize("dtype,want", [("auto", "bfloat16"), ("float16", "float16")])
def test_sft_on_a_gpu_holds_the_weights_in_the_gpus_dtype(tmp_path, monkeypatch, dtype, want):
    """device auto on a GPU machine: auto is bfloat16 and float16 is allowed, as for the RL trainer (the SFT stage
    resolved both as on a CPU: float32, and float16 refused). Stopped at the model load: no GPU here."""
    cfg = make_config("sft-tiny", {"runs_root": str(tmp_path / "runs"), "dtype": dtype})
    monkeypatch.setattr(sft, "resolve_device", lambda name, local_rank=0: torch.device("cuda:0"), raising=False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    loaded = []

    class Loaded(Exception):
        pass

    def load(name, dtype="float32"):
        loaded.append(dtype)
        raise Loaded

    monkeypatch.setattr(sft, "load_model_and_tokenizer", load)
    with pytest.raises(Loaded):
        sft.run_sft(cfg, write=lambda s: None)
    assert loaded == [want]


def _attempt(tmp_path, name, precision, **config):
    run_dir = create_attempt(make_config("tiny", {"runs_root": str(tmp_path / "runs"), "name": name, **config}))
    (run_dir / "eval").mkdir()
    res = [{"id": "p", "correct": 1.0, "has_boxed": 1.0}]
    for step in (0, 3):
        (run_dir / "eval" / f"step_{step}.json").write_text(json.dumps(
            {"mode": "greedy_pass@1", "dataset": "heldout", "n_problems": 1, "precision": precision,
             "greedy_pass@1": 1.0, "results": res}))
    return run_dir


def test_the_rl_report_labels_the_sft_parents_numbers_with_their_precision(tmp_path):
    parent = _attempt(tmp_path, "sft", "float32")
    (parent / "summary.json").write_text(json.dumps({"stage": "sft", "baseline": 0.25, "final": 0.5,
                                                     "format_before": 0.1, "format_after": 0.9}))
    (parent / "adapter").mkdir()
    child = _attempt(tmp_path, "rl", "bfloat16", init_adapter=str(parent / "adapter"))
    html = parent_html(load_attempt(child))
    assert "25.0% &rarr; 50.0% (float32)" in html
    assert "not comparable" in html and "bfloat16" in html  # the RL attempt's own evals are in another precision
    assert "precision bfloat16" in load_attempt(child).eval_label()
    same = _attempt(tmp_path, "rl2", "float32", init_adapter=str(parent / "adapter"))
    assert "not comparable" not in parent_html(load_attempt(same))
    assert yaml.safe_load((child / "config.yaml").read_text())["config"]["init_adapter"] == str(parent / "adapter")
