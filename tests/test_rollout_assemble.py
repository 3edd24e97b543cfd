"""Engine-independent rollout pieces: the Rollout assembly from token lists, make_engine('hf'), and
the message when vLLM is missing. No vLLM needed."""

import sys

import pytest
import torch

from rftlib.rollout.assemble import assemble_rollout, encode_prompts


@pytest.fixture(scope="module")
def tok(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir, padding_side="left")


def test_assemble_cuts_at_first_eos_pads_and_flags_truncation(tok):
    E, pad = tok.eos_token_id, tok.pad_token_id
    ids, mask, lists = encode_prompts(tok, ["Calculate 1 + 2.", "hi"])
    # prompt 0 is longer, so prompt 1 is left-padded; the unpadded lists drop the padding
    assert lists[0] == tok("Calculate 1 + 2.", add_special_tokens=False).input_ids
    assert lists[1] == tok("hi", add_special_tokens=False).input_ids
    assert mask[1, 0] == 0 and mask[1, -1] == 1
    samples = [
        ([5, 6, E, 7], [-1.0, -2.0, -0.5, -9.0]),  # EOS at 2: keep 5 6 EOS, drop the 7 and its logprob
        ([8], [-0.25]),  # no EOS: truncated, length 1
        ([E], [-0.125]),  # EOS at once: length 1, not truncated
        ([9, 10, 11], [-1.0, -1.0, -1.0]),  # no EOS, length 3 (the longest): T = 3
    ]
    ro = assemble_rollout(tok, ids, mask, samples, group_size=2, stop_ids=[E])
    assert ro.completion_ids.tolist() == [[5, 6, E], [8, pad, pad], [E, pad, pad], [9, 10, 11]]
    assert ro.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 1, 1]]
    assert ro.behaviour_logprobs.tolist() == [[-1.0, -2.0, -0.5], [-0.25, 0, 0], [-0.125, 0, 0], [-1.0, -1.0, -1.0]]
    assert ro.truncated.tolist() == [False, True, False, True]
    # prompt-major: rows 0,1 are prompt 0 and rows 2,3 prompt 1
    assert torch.equal(ro.prompt_ids[0], ids[0]) and torch.equal(ro.prompt_ids[1], ids[0])
    assert torch.equal(ro.prompt_ids[2], ids[1]) and torch.equal(ro.prompt_ids[3], ids[1])
    assert ro.texts[0] == tok.decode([5, 6])  # EOS and padding stripped, as HFEngine decodes
    with pytest.raises(RuntimeError, match="3 completions for 2 prompts x G=2"):
        assemble_rollout(tok, ids, mask, samples[:3], group_size=2, stop_ids=[E])


def test_every_stop_token_ends_a_completion(tok):
    """gpt-oss ends a turn with <|return|> or <|call|>, Llama 3 with <|eot_id|>: each id of the model's
    generation-config eos list ends a completion like the tokenizer's EOS (kept, not truncated, and
    not part of the text), so the truncation flag agrees with what the engine stopped on."""
    from rftlib.rollout.base import stop_token_ids

    E, pad = tok.eos_token_id, tok.pad_token_id
    R, C = 40, 41  # stand-ins for <|return|> and <|call|>
    stops = stop_token_ids(tok, [R, C, E])
    assert stops == (E, R, C)  # the tokenizer's EOS first, no repeats
    assert stop_token_ids(tok, R) == (E, R) and stop_token_ids(tok, None) == (E,)
    ids, mask, _ = encode_prompts(tok, ["a", "b"])
    samples = [([5, R, 7], [-1.0, -2.0, -3.0]), ([6, C], [-1.0, -0.5]), ([5, 6, 7], [-1.0] * 3), ([E], [-0.5])]
    ro = assemble_rollout(tok, ids, mask, samples, group_size=2, stop_ids=stops)
    assert ro.completion_ids.tolist() == [[5, R, pad], [6, C, pad], [5, 6, 7], [E, pad, pad]]
    assert ro.truncated.tolist() == [False, False, True, False]
    assert ro.texts[0] == tok.decode([5]) and ro.texts[1] == tok.decode([6])


def test_make_engine_hf_is_the_trainer_module(tiny_cfg):
    from rftlib.models.loading import load_model_and_tokenizer
    from rftlib.rollout import make_engine
    from rftlib.rollout.hf import HFEngine
    from rftlib.rollout.kinds import EngineInputs

    cfg = tiny_cfg()
    model, tok = load_model_and_tokenizer(cfg.model)
    eng = make_engine(EngineInputs.of(cfg.section), model, tok, run_dir=None)
    assert isinstance(eng, HFEngine) and eng.shares_trainer_module and eng.model is model
    assert eng.sync_weights(model) == {"seconds": 0.0, "bytes": 0, "probe_max_diff": 0.0}


def test_missing_vllm_says_how_to_install(monkeypatch):
    from rftlib.rollout.vllm import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError
    with pytest.raises(ImportError, match="pip install vllm.*setup_vllm.sh"):
        import_vllm()
