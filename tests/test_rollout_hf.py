"""The HF rollout engine samples exactly the policy the loss assumes.

- a checkpoint's generation_config.json cannot change the sampling distribution: behaviour
  logprobs still equal the trainer's logprobs at temperature T;
- behaviour logprobs cost one (N, V) at a time, not T of them (peak memory of generate);
- every Rollout tensor is on the model's device;
- decoded texts keep Harmony channel markers, so the math reward reads gpt-oss's final channel.
"""

import shutil

import pytest
import torch

from rftlib.models.forward import completion_logprobs
from rftlib.models.loading import apply_lora, load_model_and_tokenizer
from rftlib.rollout.hf import HFEngine, decode_completions, sample_categorical

torch.set_num_threads(1)

PROMPTS = [f"<|im_start|>user\nCalculate {a} + {b}.<|im_end|>\n<|im_start|>assistant\n" for a, b in
           [(1, 2), (3, 4), (5, 6)]]


def _trainer_logprobs(model, ro, temperature):
    with torch.no_grad():
        lp, _ = completion_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask,
                                    temperature=temperature, chunk_size=7, with_entropy=False)
    return lp  # (N, T)


# ---- defect 5: a checkpoint's generation_config does not enter the rollout ------------------------

FILE_SETTINGS = {  # what a checkpoint's generation_config.json may carry; each would change pi_behaviour
    "repetition_penalty": {"repetition_penalty": 1.3},
    "top_k": {"do_sample": True, "top_k": 3},
    "no_repeat_ngram_size": {"no_repeat_ngram_size": 1},
    "min_new_tokens": {"min_new_tokens": 6},
    "suppress_tokens": {"suppress_tokens": list(range(100, 300))},  # half the tiny vocab
    "temperature_top_p": {"do_sample": True, "temperature": 0.3, "top_p": 0.5},
}


@pytest.mark.parametrize("lora", [True, False], ids=["peft", "plain"])
@pytest.mark.parametrize("setting", list(FILE_SETTINGS))
def test_checkpoint_generation_config_does_not_change_sampling(tiny_dir, tmp_path, setting, lora):
    """The tiny model saved with a generation_config that sets ``setting``: generate at T=0.7 must
    still sample pi^(1/T) alone, so its behaviour logprobs equal the trainer's (which never reads
    the generation config) to 1e-4, and the model's own config is left as it was."""
    from transformers import GenerationConfig

    d = tmp_path / "model"
    shutil.copytree(tiny_dir, d)
    gc = GenerationConfig.from_pretrained(d)
    gc.update(**FILE_SETTINGS[setting])
    gc.save_pretrained(d)
    model, tok = load_model_and_tokenizer(str(d))
    for k, v in FILE_SETTINGS[setting].items():
        assert getattr(model.generation_config, k) == v  # the file really carries it
    if lora:  # the trainer's path: peft reads its base model's generation config
        model = apply_lora(model, rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    torch.manual_seed(0)
    ro = HFEngine(model, tok).generate(PROMPTS, group_size=2, max_new_tokens=12, temperature=0.7)
    assert ro.completion_mask.sum() >= 12  # something was sampled to compare
    lp = _trainer_logprobs(model, ro, 0.7)
    assert torch.allclose(lp, ro.behaviour_logprobs, atol=1e-4), (lp - ro.behaviour_logprobs).abs().max()
    gen_cfg = (model.get_base_model() if lora else model).generation_config
    for k, v in FILE_SETTINGS[setting].items():
        assert getattr(gen_cfg, k) == v  # restored after the call


def test_top_p_behaviour_logprobs_are_the_nucleus_renormalised(tiny_dir):
    """With top_p < 1 the recorded log-prob is the one generate sampled with: the nucleus
    renormalised, log p(x) - log(nucleus mass). The nucleus holds at least top_p = 0.5 of the mass
    and less than all of it (the tiny model is near uniform), so behaviour - trainer lies in
    (0, log 2 = 0.6931] at every completion token."""
    model, tok = load_model_and_tokenizer(str(tiny_dir))
    torch.manual_seed(0)
    ro = HFEngine(model, tok).generate(PROMPTS, group_size=2, max_new_tokens=8, temperature=1.0, top_p=0.5)
    lp = _trainer_logprobs(model, ro, 1.0)
    diff = (ro.behaviour_logprobs - lp)[ro.completion_mask > 0]
    assert torch.isfinite(ro.behaviour_logprobs).all()  # a filtered pad after EOS must not leave -inf / NaN
    # the nucleus holds at least half the mass: renormalising adds between 0 and log 2 = 0.693
    assert (diff > 1e-3).all() and (diff <= 0.6932).all()


# ---- the draw: inverse CDF instead of torch.multinomial ----------------------------------------

def test_sample_categorical_draws_each_index_with_its_probability():
    """Unnormalised rows [1, 0, 6, 3] (p = 0.1, 0, 0.6, 0.3) and [0, 0, 0, 2] (always index 3):
    40,000 draws of the first row land within 0.01 of p (3.3 standard errors of 0.0024 at p = 0.6),
    the zero-probability index never, the second row only on 3."""
    torch.manual_seed(0)
    probs = torch.tensor([[1.0, 0.0, 6.0, 3.0], [0.0, 0.0, 0.0, 2.0]]).repeat(20_000, 1)  # (40000, 4)
    ids = sample_categorical(probs)  # (40000, 1)
    assert ids.shape == (40_000, 1) and ids.dtype == torch.long
    first = torch.bincount(ids[0::2, 0], minlength=4).float() / 20_000
    assert torch.allclose(first, torch.tensor([0.1, 0.0, 0.6, 0.3]), atol=0.01), first
    assert first[1] == 0 and (ids[1::2] == 3).all()
    with pytest.raises(RuntimeError, match="finite"):
        sample_categorical(torch.tensor([[0.0, float("nan")]]))


def test_sampled_first_tokens_follow_the_models_distribution():
    """One prompt, 4000 samples of one token from a 10-token model at T = 0.7: the empirical
    frequencies are within 0.05 in total variation of softmax(logits / 0.7) (expected TV of 4000
    draws over 10 tokens is ~0.02), and each recorded log-prob is that distribution's log p."""
    model, tok = _wide_model(10)
    with torch.no_grad():
        logits = model(tok(["w1 w2 w3"], return_tensors="pt").input_ids).logits[0, -1]  # (V,)
    p = torch.softmax(logits / 0.7, -1)  # (V,)
    assert p.max() < 0.5  # a spread distribution: a wrong sampler shows
    torch.manual_seed(0)
    ro = HFEngine(model, tok).generate(["w1 w2 w3"], group_size=4000, max_new_tokens=1, temperature=0.7)
    first = ro.completion_ids[:, 0]  # (4000,)
    freq = torch.bincount(first, minlength=10).float() / 4000
    tv = 0.5 * float((freq - p).abs().sum())
    assert tv < 0.05, (tv, freq, p)
    torch.testing.assert_close(ro.behaviour_logprobs[:, 0], p.log()[first], atol=1e-5, rtol=0)


# ---- the shared prefill: each prompt's cache computed once for its G samples -----------------------

UNEVEN = [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n" for q in
          ["Calculate 1 + 2.", "Calculate 123 + 45678, then subtract 9 and say why.", "Hi"]]


@pytest.mark.parametrize("lora", [True, False], ids=["peft", "plain"])
def test_shared_prefill_samples_what_a_full_prefill_samples(tiny_dir, monkeypatch, lora):
    """Three left-padded prompts of different lengths, G = 3, T = 0.7: with the shared prompt cache
    (one prefill of B = 3 rows) and without it (generate's own prefill of 9 rows), the same seed
    draws the same tokens and records the same log-probs (to matmul rounding), and both equal the
    trainer's log-probs, which use explicit position ids: so the cached keys sit at the positions
    a full prefill gives them, padding included."""
    import rftlib.rollout.hf as hf

    model, tok = load_model_and_tokenizer(str(tiny_dir))
    if lora:
        model = apply_lora(model, rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
        for n, p in model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1)  # a live adapter: the cache must include it
    lens = tok(UNEVEN, add_special_tokens=False, return_length=True)["length"]
    assert len(set(lens)) == 3  # really uneven: the batch is left-padded
    calls = []
    real = hf.shared_prompt_cache
    monkeypatch.setattr(hf, "shared_prompt_cache", lambda m, ids, mask, g: calls.append(tuple(ids.shape)) or real(m, ids, mask, g))

    def run():
        torch.manual_seed(0)
        return HFEngine(model, tok).generate(UNEVEN, group_size=3, max_new_tokens=10, temperature=0.7)

    shared = run()
    assert calls == [(3, max(lens))]  # one prefill over the 3 distinct prompts
    monkeypatch.setattr(hf, "shared_prompt_cache", lambda *a: None)
    full = run()
    assert torch.equal(shared.completion_ids, full.completion_ids) and shared.completion_mask.sum() >= 30
    torch.testing.assert_close(shared.behaviour_logprobs, full.behaviour_logprobs, atol=1e-5, rtol=0)
    lp = _trainer_logprobs(model, shared, 0.7)
    assert torch.allclose(lp, shared.behaviour_logprobs, atol=1e-4), (lp - shared.behaviour_logprobs).abs().max()


# ---- defect 6: peak memory of generate does not grow with V x T --------------------------------

def _wide_model(V: int):
    """A 1-layer Llama with a V-token word-level vocabulary (w0 ... w{V-3}, <eos>, <unk>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(V - 2)} | {"<eos>": V - 2, "<unk>": V - 1}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<eos>", unk_token="<unk>",
                                  padding_side="left")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, eos_token_id=V - 2, pad_token_id=V - 2, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg), tok


def _peak_bytes(fn) -> int:
    """Peak of live CPU tensor bytes allocated during fn() (allocations minus frees, in time order),
    from the torch profiler's memory events (the data its memory tables are built from)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    assert events, "the profiler recorded no memory events"
    live = peak = 0
    for e in events:
        live += e.nbytes()  # > 0 allocation, < 0 free
        peak = max(peak, live)
    return peak


def test_generate_peak_memory_does_not_grow_with_vocab_times_length():
    """N=8 rows, V=32000: one (N, V) float32 is 1.02 MB. Keeping every step's scores
    (output_scores) would add 36 of them (36.9 MB) going from T=4 to T=40; recording the sampled
    token's log-prob step by step keeps the growth under 4 of them (4.1 MB: the KV cache and the
    (N, T) results are a few kB)."""
    V, N = 32000, 8
    model, tok = _wide_model(V)
    engine = HFEngine(model, tok)
    nv_bytes = N * V * 4  # one (N, V) float32

    def run(T):
        out = {}

        def gen():
            torch.manual_seed(0)
            out["ro"] = engine.generate(["w1 w2 w3"] * 4, group_size=2, max_new_tokens=T, temperature=0.7)
        peak = _peak_bytes(gen)
        assert out["ro"].completion_ids.shape == (N, T)  # ran all T steps (EOS is 1 token in 32000)
        return peak

    short, long = run(4), run(40)
    assert long - short < 4 * nv_bytes, (short, long)


# ---- item 4: any device ------------------------------------------------------------------------

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("greedy", [False, True], ids=["sample", "greedy"])
@pytest.mark.parametrize("device", DEVICES)
def test_rollout_tensors_are_on_the_models_device(tiny_dir, device, greedy):
    """Inputs go to the model's device and every Rollout tensor comes back there; texts are str.
    (On a CPU-only machine this checks the contract; it can only catch a missing .to() on a GPU.)"""
    from rftlib.rollout.base import Rollout

    model, tok = load_model_and_tokenizer(str(tiny_dir))
    model.to(device)
    ro = HFEngine(model, tok).generate(PROMPTS, group_size=2, max_new_tokens=6, temperature=0.7, greedy=greedy)
    tensors = {k: v for k, v in vars(ro).items() if isinstance(v, torch.Tensor)}
    assert set(tensors) == {f for f, t in Rollout.__annotations__.items() if "Tensor" in str(t)}
    want = torch.device(device)
    assert {k: v.device.type for k, v in tensors.items()} == {k: want.type for k in tensors}
    assert len(ro.texts) == 6 and all(isinstance(t, str) for t in ro.texts)


# ---- defect 8: Harmony markers survive decoding ------------------------------------------------

HARMONY_SPECIAL = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                   "<|end|>", "<|message|>", "<|call|>"]  # gpt-oss's (openai/gpt-oss-20b tokenizer_config.json)
HARMONY_PROMPT = "<|start|>user<|message|>What is 6 * 7?<|end|><|start|>assistant"
# the analysis channel names a wrong boxed answer; only the final channel holds the model's answer
HARMONY_RESPONSE = ("<|channel|>analysis<|message|>Maybe \\boxed{7}? No: 6 * 7 = 42.<|end|>"
                    "<|start|>assistant<|channel|>final<|message|>The answer is 42.")


def _harmony_tokenizer():
    """A byte-level BPE with gpt-oss's special tokens and its eos (<|return|>) and pad (<|endoftext|>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=HARMONY_SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([HARMONY_PROMPT + HARMONY_RESPONSE + "<|return|>"], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|startoftext|>", eos_token="<|return|>",
                                   pad_token="<|endoftext|>", padding_side="left")


def _scripted_model(tok, script: list[int], prompt_len: int):
    """A tiny Llama whose k-th generation step puts all mass on script[k] (a forward hook on the
    logits), so the real generate / EOS cut / decode path produces a known Harmony response. The
    step is read from the position of the call's last token (prompt_len - 1 + k), so a forward that
    only fills the prompt's cache (HFEngine's shared prefill) is no step."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)

    def force(module, args, kwargs, output):
        k = int(kwargs["position_ids"][0, -1]) - (prompt_len - 1)  # one unpadded prompt per batch
        if k >= 0:
            output.logits[:, -1, :] = float("-inf")
            output.logits[:, -1, script[min(k, len(script) - 1)]] = 0.0
        return output

    model.register_forward_hook(force, with_kwargs=True)
    return model


def test_harmony_markers_reach_the_math_reward():
    """gpt-oss answers in Harmony channels. Decoded with special tokens skipped, the response reads
    "analysisMaybe \\boxed{7}? ... assistantfinalThe answer is 42." and the reward takes the boxed 7
    (reward 0). Decoded with the markers, the reward reads the final channel: 42 (reward 1)."""
    from rftlib.rewards.math import math_reward

    tok = _harmony_tokenizer()
    script = tok(HARMONY_RESPONSE + "<|return|>", add_special_tokens=False).input_ids
    special = {t.content for t in tok.added_tokens_decoder.values() if t.special}
    assert {"<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|return|>"} <= special  # as in gpt-oss
    skipped = tok.decode(script, skip_special_tokens=True)  # what the engine used to hand the reward
    assert skipped.startswith("analysisMaybe") and math_reward(skipped, "42", truncated=False).reward == 0.0
    model = _scripted_model(tok, script, prompt_len=len(tok(HARMONY_PROMPT, add_special_tokens=False).input_ids))
    ro = HFEngine(model, tok).generate([HARMONY_PROMPT], group_size=2, max_new_tokens=len(script) + 5,
                                       temperature=1.0)
    assert ro.texts == [HARMONY_RESPONSE] * 2  # everything the model wrote but the <|return|> that ended it
    assert not ro.truncated.any() and ro.completion_mask.sum(-1).tolist() == [len(script)] * 2
    r = math_reward(ro.texts[0], "42", truncated=False)
    assert r.pred == "42" and r.reward == 1.0


def test_decode_drops_only_the_ending_eos_and_padding(tiny_dir):
    """ChatML (eos = pad = <|im_end|>): a finished row loses its <|im_end|> and the padding after
    it; a special token the model wrote mid-completion (<|im_start|>) stays in the text."""
    _, tok = load_model_and_tokenizer(str(tiny_dir))
    a = tok("The answer is 4.", add_special_tokens=False).input_ids
    b = tok("5<|im_start|>user", add_special_tokens=False).input_ids
    eos, pad = tok.eos_token_id, tok.pad_token_id
    T = max(len(a) + 1, len(b)) + 2
    rows = [a + [eos] + [pad] * (T - len(a) - 1), b + [pad] * (T - len(b))]
    masks = [[1.0] * (len(a) + 1) + [0.0] * (T - len(a) - 1), [1.0] * len(b) + [0.0] * (T - len(b))]
    texts = decode_completions(tok, torch.tensor(rows), torch.tensor(masks))
    assert texts == ["The answer is 4.", "5<|im_start|>user"]


def test_generation_config_eos_list_stops_hf_rollouts(tiny_dir):
    """A model whose generation config lists several ends (gpt-oss: <|return|>, <|call|>; Llama 3:
    <|eot_id|>) stops at each of them, not only at the tokenizer's EOS: greedy decoding's first token is
    made a stop, so every row that starts with it is one token long and not truncated."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rftlib.rollout.hf import HFEngine

    tok = AutoTokenizer.from_pretrained(tiny_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    prompts = ["Calculate 1 + 2.", "hi"]
    before = HFEngine(model, tok).generate(prompts, group_size=1, max_new_tokens=6, temperature=1.0, greedy=True)
    first = int(before.completion_ids[0, 0])
    assert first != tok.eos_token_id and before.lengths()[0] > 1  # the model runs on past that token today
    model.generation_config.eos_token_id = [tok.eos_token_id, first]
    ro = HFEngine(model, tok).generate(prompts, group_size=1, max_new_tokens=6, temperature=1.0, greedy=True)
    assert ro.completion_ids[0, 0] == first and ro.lengths()[0] == 1 and not ro.truncated[0]
    assert ro.texts[0] == ""  # the stop token is not text a reward reads
    assert model.generation_config.eos_token_id == [tok.eos_token_id, first]  # the model's config is put back
