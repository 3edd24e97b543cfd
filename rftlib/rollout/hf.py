"""Rollouts with HF ``generate``: one batched call samples G completions for B prompts.

The engine shares the trainer's module, so weight sync is a no-op; on GPUs the vLLM engine
replaces it. What it guarantees, so that the loss's importance ratio is about the policy that
really sampled (``pi(. | x)`` at temperature T, nucleus top_p, nothing else):

- **The whole sampling distribution comes from the call's arguments.** ``generate`` fills every
  field a GenerationConfig leaves unset from the checkpoint's ``generation_config.json`` and then
  from transformers' own defaults (top_k=50), so a checkpoint that ships ``repetition_penalty``,
  ``top_k``, ``min_new_tokens``, ``no_repeat_ngram_size``, ``suppress_tokens``, ... would silently
  change what is sampled. :func:`sampling_config` builds a complete config from the arguments, and
  the model's own config is set aside for the duration of the call (:func:`_only_this_config`).
- **Behaviour logprobs without ``output_scores``.** Keeping every step's scores holds T tensors of
  (N, V) float32 (seed 003: 128 x 4096 x 201k x 4 bytes). Temperature and top-p are applied by our
  own processors, and the last processor, :class:`BehaviourLogprobs`, sees exactly the scores
  ``generate`` samples from: it keeps one (N, V) log-softmax and, at the next step, gathers the
  token that was drawn from it.
- **Any device.** Inputs go to the model's device; every Rollout tensor comes back on it.
- **Texts keep what the model wrote.** Only the EOS that ended a completion and the padding after
  it are dropped, so Harmony channel markers (gpt-oss) reach the reward's final-channel extraction.

Dimensions: ``N = B*G`` rows (prompt-major), ``P`` prompt tokens, ``T`` completion tokens, ``V`` vocab.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from rftlib.models.loading import autocast
from rftlib.rollout.base import Rollout, decode_completions  # noqa: F401  (decode_completions: re-exported)


def sampling_config(*, max_new_tokens: int, greedy: bool, eos_token_id: int, pad_token_id: int) -> GenerationConfig:
    """The complete generation config of a rollout, from these arguments only.

    Every field that can change the next-token distribution is set to its neutral value, so
    neither the checkpoint's generation_config.json nor transformers' defaults can fill it in.
    Temperature and top-p are not here: :class:`HFEngine` applies them as explicit processors
    placed before :class:`BehaviourLogprobs` (generate appends user processors after its own
    filters but before its temperature/top-k/top-p warpers, which would come after the recorder).
    """
    # warpers that only act when sampling (set only then: generate warns about them under greedy)
    sample = dict(temperature=1.0, top_k=0, top_p=1.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0)
    return GenerationConfig(
        do_sample=not greedy, num_beams=1, max_new_tokens=max_new_tokens, min_new_tokens=0,
        repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0, renormalize_logits=False, remove_invalid_values=False,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, use_cache=True,
        output_scores=False, output_logits=False, return_dict_in_generate=False,
        **({} if greedy else sample),
    )


@contextmanager
def _only_this_config(model, config: GenerationConfig):
    """Make ``config`` the model's generation config for one call, then put the saved one back.

    ``generate`` merges every field a passed config leaves None (``bad_words_ids``,
    ``suppress_tokens``, ``forced_eos_token_id``, ``sequence_bias``, ... whose neutral value *is*
    None) from ``model.generation_config``; with ours in its place there is nothing else to merge.
    A peft model reads (and copies down) its base model's config, so that is the one swapped.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = inner.generation_config
    inner.generation_config = config
    try:
        yield
    finally:
        inner.generation_config = saved


class BehaviourLogprobs(LogitsProcessor):
    """Records log pi_behaviour(sampled token) per step, holding one (N, V) at a time.

    Placed last in the processor list, it receives the exact scores ``generate`` turns into the
    sampling probabilities. A step's token is only known at the next call (it is then the last
    column of ``input_ids``), so each call gathers the previous distribution at that token and
    keeps its own; :meth:`logprobs` gathers the last step from the returned completion.
    """

    def __init__(self):
        self.prev: torch.Tensor | None = None  # (N, V) float32 log-softmax of the last step's scores
        self.steps: list[torch.Tensor] = []  # per step (N,)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))  # (N,)
        self.prev = None  # free the old (N, V) before making the new one
        self.prev = torch.log_softmax(scores.float(), -1)  # (N, V)
        return scores

    def logprobs(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """(N, T) behaviour logprobs of ``completion_ids`` (N, T), the tokens sampled at the recorded steps."""
        T = completion_ids.shape[1]
        steps = self.steps[:T]  # a generate that runs a step past the stop (deferred stop check) undoes it
        if len(steps) < T and self.prev is not None:
            steps.append(self.prev.gather(-1, completion_ids[:, T - 1:T]).squeeze(-1))  # (N,)
        self.prev, self.steps = None, []
        if len(steps) != T:
            raise RuntimeError(f"recorded {len(steps)} sampling steps for {T} completion tokens")
        if not steps:
            return torch.zeros(completion_ids.shape, device=completion_ids.device)  # (N, 0)
        return torch.stack(steps, 1)  # (N, T)


class HFEngine:
    shares_trainer_module = True  # behaviour logprobs are the trainer's own: no old-logprob pass, no TIS

    def __init__(self, model, tokenizer, amp: torch.dtype | None = None, synced_gpus: bool = False):
        self.model = model
        self.tok = tokenizer
        self.amp = amp  # autocast dtype for generation (None: the weights' dtype)
        self.synced_gpus = synced_gpus  # ZeRO-3 ranks keep stepping until every rank is done (HF generate)
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
        """Sample group_size completions per prompt at ``temperature`` and ``top_p`` (greedy: argmax);
        nothing else shapes the distribution. Tensors come back on the model's device."""
        tok, model = self.tok, self.model
        device = next(model.parameters()).device
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_ids = enc.input_ids.to(device).repeat_interleave(group_size, 0)  # (N, P)
        prompt_mask = enc.attention_mask.to(device).repeat_interleave(group_size, 0)  # (N, P)
        config = sampling_config(max_new_tokens=max_new_tokens, greedy=greedy, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        processors = LogitsProcessorList()
        recorder = None
        if not greedy:
            if temperature != 1.0:
                processors.append(TemperatureLogitsWarper(temperature))
            if top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p))
            recorder = BehaviourLogprobs()
            processors.append(recorder)  # last: it sees what is sampled from
        was_training = model.training
        model.eval()
        try:
            with autocast(self.amp, device.type), _only_this_config(model, config):
                # synced_gpus: ZeRO-3 ranks keep stepping until every rank is done (each step is a collective)
                sequences = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config,
                                           logits_processor=processors, synced_gpus=self.synced_gpus)  # (N, P+T)
        finally:
            model.train(was_training)
        P = prompt_ids.shape[1]
        completion_ids = sequences[:, P:]  # (N, T)
        N, T = completion_ids.shape
        is_eos = completion_ids == tok.eos_token_id  # (N, T)
        # tokens up to and including the first EOS are the completion
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # (N, T) strictly after the first EOS
        completion_mask = (~after_eos).float()  # (N, T)
        truncated = ~is_eos.any(-1)  # (N,)
        completion_ids = completion_ids.masked_fill(after_eos, tok.pad_token_id)
        if recorder is None:
            behaviour = torch.zeros(N, T, device=device)  # (N, T)
        else:
            behaviour = recorder.logprobs(completion_ids)  # (N, T)
            # where, not a product: a top-p-filtered pad after EOS has log-prob -inf, and -inf * 0 is NaN
            behaviour = torch.where(completion_mask > 0, behaviour, torch.zeros_like(behaviour))  # (N, T)
        return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask.float(), completion_ids=completion_ids,
                       completion_mask=completion_mask, behaviour_logprobs=behaviour, truncated=truncated,
                       texts=decode_completions(tok, completion_ids, completion_mask), group_size=group_size)
