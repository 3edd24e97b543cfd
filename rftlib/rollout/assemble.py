"""Turn an engine's per-row samples (token ids and their logprobs) into the ``Rollout`` contract.

Shared by every engine that hands back token lists rather than a padded tensor (vLLM in-process
and over HTTP), so the cut at the first stop token, the padding and the truncation flags are written
once: a completion is its tokens up to and including the first stop token (the model learns to stop),
padded after with pad_token_id; it is truncated when no stop token came within max_new_tokens. The stop
set is the engine's (rftlib.rollout.base.stop_token_ids), the one it asked the engine to stop on, so the
truncation flag agrees with what the engine did.
"""

from __future__ import annotations

import threading
from typing import Sequence

import torch

from rftlib.rollout.base import Rollout, decode_completions

# a padded batch call sets the Rust tokenizer's padding state for the call, and two threads doing it at once (an
# asynchronous producer's batch and an eval or the sync probe on the trainer's thread, max_staleness > 0) fail with
# "Already borrowed": encoding is serialised (it is milliseconds; the generation it feeds is not)
_TOKENIZER_LOCK = threading.Lock()


def encode_prompts(tok, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """(ids (B, P) left-padded, mask (B, P) long, per-prompt unpadded id lists) with the trainer's
    tokenizer, exactly as HFEngine encodes them (chat template already applied, no special tokens)."""
    if tok.padding_side != "left":
        raise ValueError("the rollout engines need a left-padding tokenizer (pass padding_side='left')")
    with _TOKENIZER_LOCK:
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids_lists = [row[m.bool()].tolist() for row, m in zip(enc.input_ids, enc.attention_mask)]
    return enc.input_ids, enc.attention_mask, ids_lists


def assemble_rollout(tok, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, samples: list[tuple[list[int], list[float]]],
                     *, group_size: int, stop_ids: Sequence[int]) -> Rollout:
    """Build a Rollout from N = B*G prompt-major samples (token ids, logprob per token).

    prompt_ids/prompt_mask are (B, P) and get repeated G times; logprob lists may be empty (greedy),
    which gives zero behaviour logprobs.
    """
    B = prompt_ids.shape[0]
    N = B * group_size
    if len(samples) != N:
        raise RuntimeError(f"the engine returned {len(samples)} completions for {B} prompts x G={group_size}")
    stops = set(stop_ids)
    cut = []
    for ids, lps in samples:
        ids = list(ids)
        end = next((k for k, t in enumerate(ids) if t in stops), None)
        if end is not None:
            ids = ids[:end + 1]  # keep the stop token: the model learns to stop
        cut.append((ids, list(lps)[:len(ids)] if lps else [0.0] * len(ids)))
    T = max(1, max(len(ids) for ids, _ in cut))
    completion_ids = torch.full((N, T), tok.pad_token_id, dtype=torch.long)  # (N, T)
    completion_mask = torch.zeros(N, T)  # (N, T)
    behaviour = torch.zeros(N, T)  # (N, T) float32
    truncated = torch.zeros(N, dtype=torch.bool)  # (N,)
    for i, (ids, lps) in enumerate(cut):
        n = len(ids)
        if n:
            completion_ids[i, :n] = torch.tensor(ids)
            completion_mask[i, :n] = 1.0
            behaviour[i, :n] = torch.tensor(lps, dtype=torch.float32)
        truncated[i] = not ids or ids[-1] not in stops
    texts = decode_completions(tok, completion_ids, completion_mask, stops)  # the HF engine's rule: Harmony markers kept
    return Rollout(prompt_ids=prompt_ids.repeat_interleave(group_size, 0),  # (N, P)
                   prompt_mask=prompt_mask.repeat_interleave(group_size, 0).float(),  # (N, P)
                   completion_ids=completion_ids, completion_mask=completion_mask, behaviour_logprobs=behaviour,
                   truncated=truncated, texts=texts, group_size=group_size)
