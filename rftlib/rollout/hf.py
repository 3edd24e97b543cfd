"""Rollouts with HF ``generate``: one batched call samples G completions for B prompts.

The engine shares the trainer's module, so weight sync is a no-op; on GPUs the vLLM engine
replaces it. Behaviour logprobs come from generate's processed scores (temperature applied),
gathered at the sampled token, so they match what the trainer computes at ratio 1.
"""

from __future__ import annotations

import torch

from rftlib.models.loading import autocast
from rftlib.rollout.base import Rollout


class HFEngine:
    shares_trainer_module = True  # behaviour logprobs are the trainer's own: no old-logprob pass, no TIS

    def __init__(self, model, tokenizer, amp: torch.dtype | None = None):
        self.model = model
        self.tok = tokenizer
        self.amp = amp  # autocast dtype for generation (None: the weights' dtype)
        if tokenizer.padding_side != "left":
            raise ValueError("HFEngine needs a left-padding tokenizer (pass padding_side='left')")

    def sync_weights(self, model) -> dict:
        self.model = model
        return {"seconds": 0.0, "bytes": 0, "probe_max_diff": 0.0}

    def close(self) -> None:
        pass

    @torch.no_grad()
    def generate(self, prompts: list[str], *, group_size: int, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, greedy: bool = False) -> Rollout:
        tok, model = self.tok, self.model
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_ids = enc.input_ids.repeat_interleave(group_size, 0)  # (N, P)
        prompt_mask = enc.attention_mask.repeat_interleave(group_size, 0)  # (N, P)
        was_training = model.training
        model.eval()
        kw = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        with autocast(self.amp):
            out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, max_new_tokens=max_new_tokens,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                 return_dict_in_generate=True, output_scores=not greedy, **kw)
        model.train(was_training)
        P = prompt_ids.shape[1]
        completion_ids = out.sequences[:, P:]  # (N, T)
        N, T = completion_ids.shape
        is_eos = completion_ids == tok.eos_token_id  # (N, T)
        # tokens up to and including the first EOS are the completion
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # (N, T) strictly after the first EOS
        completion_mask = (~after_eos).float()  # (N, T)
        truncated = ~is_eos.any(-1)  # (N,)
        completion_ids = completion_ids.masked_fill(after_eos, tok.pad_token_id)
        if greedy:
            behaviour = torch.zeros(N, T)
        else:
            # out.scores: T tensors (N, V) of processed logits (temperature applied); one at a time,
            # so the (N, T, V) stack never exists
            behaviour = torch.stack([
                torch.log_softmax(s.float(), -1).gather(-1, completion_ids[:, t:t + 1]).squeeze(-1)
                for t, s in enumerate(out.scores)], 1)  # (N, T)
            behaviour = behaviour * completion_mask  # (N, T)
        texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
        return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask.float(), completion_ids=completion_ids,
                       completion_mask=completion_mask, behaviour_logprobs=behaviour, truncated=truncated,
                       texts=texts, group_size=group_size)
