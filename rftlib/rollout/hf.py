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
  own processors, and the last processor, :class:`SampleAndRecord`, draws the token itself from
  the scores they leave and records its log-prob at once (generate runs in greedy mode and takes
  the drawn token): one (N, V) log-softmax a step, and no ``torch.multinomial``, whose CPU kernel
  draws an exponential for each of the N x V entries (~14% of a SmolLM2 rollout).
- **Any device.** Inputs go to the model's device; every Rollout tensor comes back on it.
- **Texts keep what the model wrote.** Only the stop token that ended a completion and the padding
  after it are dropped, so Harmony channel markers (gpt-oss) reach the reward's final-channel extraction.
- **Every end the model knows stops it.** The stop set is :func:`~rftlib.rollout.base.model_stop_token_ids`
  (the tokenizer's EOS and the generation config's eos list), read once when the engine is made:
  generate is given the whole list, and the cut and truncation flag below use the same set.

Dimensions: ``N = B*G`` rows (prompt-major), ``P`` prompt tokens, ``T`` completion tokens, ``V`` vocab.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from rftlib.models.loading import DTYPES, autocast
from rftlib.rollout.base import Rollout, decode_completions, model_stop_token_ids


def sampling_config(*, max_new_tokens: int, eos_token_id: int | list[int], pad_token_id: int) -> GenerationConfig:
    """The complete generation config of a rollout, from these arguments only.

    Every field that can change the next-token distribution is set to its neutral value, so
    neither the checkpoint's generation_config.json nor transformers' defaults can fill it in.
    generate runs in greedy mode (``do_sample=False``: none of its own warpers, argmax of the
    processed scores) for sampled rollouts too: temperature, top-p and the draw itself are
    explicit processors (:class:`HFEngine`), the last of which, :class:`SampleAndRecord`, leaves
    only the drawn token finite. generate appends user processors after its own filters.
    """
    return GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, min_new_tokens=0,
        repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0, renormalize_logits=False, remove_invalid_values=False,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, use_cache=True,
        output_scores=False, output_logits=False, return_dict_in_generate=False,
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


def sample_categorical(probs: torch.Tensor) -> torch.Tensor:
    """One draw per row from ``probs`` (N, V) (rows need not sum to 1) by inverse CDF -> (N, 1) ids.

    The draw is the first index whose running sum exceeds u * total, u ~ U[0, 1): index i is picked
    with probability p_i / total, and a zero-probability index (an empty CDF step) never. On a CPU
    ``torch.multinomial`` draws an exponential variate for every one of the N x V entries (SmolLM2,
    64 x 49,152: ~100 ms a decode step, ~14% of the rollout's generate); this needs one float32
    cumsum (~2 ms) and N uniforms. The float32 running sum moves each p_i by at most ~6e-8 absolute.
    """
    cdf = probs.float().cumsum(-1)  # (N, V)
    total = cdf[:, -1:]  # (N, 1)
    if not bool(((total > 0) & torch.isfinite(total)).all()):
        raise RuntimeError("sampling probabilities must be finite, non-negative and not all zero in a row")
    u = torch.rand(probs.shape[0], 1, device=probs.device) * total  # (N, 1)
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[-1] - 1)  # (N, 1)


def sampling_processors(temperature: float, top_p: float,
                        greedy: bool) -> tuple[LogitsProcessorList, "SampleAndRecord | None"]:
    """The processors a rollout's generate runs in its greedy mode (:func:`sampling_config`): temperature and top-p
    warpers, then :class:`SampleAndRecord` last (it samples from what the others left and records the logprob);
    ``greedy``: none (argmax, no recorder)."""
    processors = LogitsProcessorList()
    if greedy:
        return processors, None
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    recorder = SampleAndRecord()
    processors.append(recorder)
    return processors, recorder


class SampleAndRecord(LogitsProcessor):
    """Draws each step's token itself and records log pi_behaviour(token), holding one (N, V) at a time.

    Placed last in the processor list, it receives the exact scores the rollout samples from (after
    generate's own filters such as min_new_tokens and our temperature / top-p warpers), draws the
    token with :func:`sample_categorical`, records its log-softmax, and returns scores that are 0 at
    that token and -inf elsewhere; generate runs in greedy mode (``do_sample=False``), whose argmax
    then takes exactly the drawn token. So the token and its recorded log-prob come from one
    distribution by construction, and the CPU's slow ``torch.multinomial`` is not called.
    """

    def __init__(self):
        self.steps: list[torch.Tensor] = []  # per step (N,)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logp = torch.log_softmax(scores.float(), -1)  # (N, V)
        token = sample_categorical(logp.exp())  # (N, 1)
        self.steps.append(logp.gather(-1, token).squeeze(-1))  # (N,)
        return torch.full_like(scores, float("-inf")).scatter_(-1, token, 0.0)  # (N, V): argmax = token

    def logprobs(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """(N, T) behaviour logprobs of ``completion_ids`` (N, T), one recorded step per token."""
        T = completion_ids.shape[1]
        steps, self.steps = self.steps, []
        if len(steps) != T:
            raise RuntimeError(f"recorded {len(steps)} sampling steps for {T} completion tokens")
        if not steps:
            return torch.zeros(completion_ids.shape, device=completion_ids.device)  # (N, 0)
        return torch.stack(steps, 1)  # (N, T)


def shared_prompt_cache(model, ids: torch.Tensor, mask: torch.Tensor, group_size: int):
    """The KV cache of each prompt's first P-1 tokens, computed once per prompt and repeated
    ``group_size`` times (prompt-major, as the rollout's rows), for ``generate(past_key_values=...)``.

    generate on the G-times repeated prompts would run the same prefill G times: on the default
    demo (37 prompt tokens, 48 completion tokens, G = 8) the prefill is ~40% of the rollout's model
    FLOPs, and 7/8 of it is repeated work. The last prompt token is left to generate, which needs
    at least one uncached token to produce the first logits. Position ids are generate's own for a
    left-padded batch (cumsum of the mask - 1, 0 at padding), so cached keys match what generate's
    prefill would have computed, up to matmul rounding. ids, mask: (B, P) -> a transformers Cache
    holding (B * group_size) rows of P-1 positions.
    """
    pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # (B, P)
    out = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1], use_cache=True,
                logits_to_keep=1)  # only the cache is used: skip the LM head on the prefix
    cache = out.past_key_values
    cache.batch_repeat_interleave(group_size)  # (B, ...) -> (B * G, ...) per layer
    return cache


class HFEngine:
    shares_trainer_module = True  # behaviour logprobs are the trainer's own: no old-logprob pass, no TIS

    def __init__(self, model, tokenizer, amp: torch.dtype | None = None, synced_gpus: bool = False, gather=None,
                 gather_plan: str = ""):
        self.model = model
        self.tok = tokenizer
        self.amp = amp  # autocast dtype for generation (None: the weights' dtype)
        self.synced_gpus = synced_gpus  # ZeRO-3 ranks keep stepping until every rank is done (HF generate)
        # ZeRO-3: a context that holds the whole model gathered for one generate call (the backend's
        # gathered_for_generation); None: DeepSpeed's hooks gather each layer at every decode step
        self.gather = gather
        self.gather_plan = gather_plan  # why the gather is used or not, in words (the trainer prints it)
        # read before any call: _only_this_config sets the model's own generation config aside during generate
        self.stop_ids = model_stop_token_ids(tokenizer, model)
        if tokenizer.padding_side != "left":
            raise ValueError("HFEngine needs a left-padding tokenizer (pass padding_side='left')")

    def _weights_dtype(self) -> torch.dtype:
        """The dtype the frozen weights are held in (trainable ones may be float32 masters under a half dtype)."""
        params = list(self.model.parameters())
        frozen = [p for p in params if not p.requires_grad and p.is_floating_point()]
        return (frozen or params)[0].dtype

    @property
    def precision(self) -> str:
        """The dtype generate computes in: the autocast dtype, else the weights' (rftlib.eval.engine_precision)."""
        return str(self.amp or self._weights_dtype()).removeprefix("torch.")

    @contextmanager
    def use_precision(self, name: str):
        """Generate in dtype ``name`` (float32 | bfloat16 | float16) inside the block (rftlib.eval.eval_numerics):
        float32 turns autocast off, a half dtype autocasts to it. float32 over half weights is refused: the
        weights would have to be copied up, and the eval would not be in the precision it claims."""
        if name not in DTYPES:
            raise ValueError(f"eval precision '{name}': choose one of {', '.join(DTYPES)}")
        if name == "float32" and self._weights_dtype() != torch.float32:
            raise ValueError(f"eval_dtype float32, but the weights are held in {self._weights_dtype()}: set eval_dtype "
                             "to auto (the weights' dtype) or load the model in float32 (dtype: float32)")
        saved = self.amp
        self.amp = None if name == "float32" else DTYPES[name]
        try:
            yield
        finally:
            self.amp = saved

    def sync_weights(self, model, adapter_state=None, *, push: bool = True, barrier=None,
                     verify: bool = False) -> dict:
        """The engine is the trainer's module: nothing moves (every rank generates with its own)."""
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
        ids, mask = enc.input_ids.to(device), enc.attention_mask.to(device)  # (B, P) each
        prompt_ids = ids.repeat_interleave(group_size, 0)  # (N, P)
        prompt_mask = mask.repeat_interleave(group_size, 0)  # (N, P)
        # sampling runs in generate's greedy mode: SampleAndRecord draws the token, argmax takes it
        config = sampling_config(max_new_tokens=max_new_tokens, eos_token_id=list(self.stop_ids),
                                 pad_token_id=tok.pad_token_id)
        processors, recorder = sampling_processors(temperature, top_p, greedy)
        was_training = model.training
        model.eval()
        gathered = self.gather is not None
        try:
            with (self.gather() if gathered else nullcontext()), autocast(self.amp, device.type), \
                    _only_this_config(model, config):
                cache = None
                if group_size > 1 and prompt_ids.shape[1] > 1:  # each prompt's prefill once, not G times
                    cache = shared_prompt_cache(model, ids, mask, group_size)
                # synced_gpus: ZeRO-3 ranks keep stepping until every rank is done (each step is a collective)
                # gathered, no step is a collective: each rank stops when its own rows are done
                sequences = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config,
                                           logits_processor=processors, synced_gpus=self.synced_gpus and not gathered,
                                           past_key_values=cache)  # (N, P+T)
        finally:
            model.train(was_training)
        P = prompt_ids.shape[1]
        completion_ids = sequences[:, P:]  # (N, T)
        N, T = completion_ids.shape
        stops = torch.tensor(self.stop_ids, device=completion_ids.device)  # (S,)
        is_eos = torch.isin(completion_ids, stops)  # (N, T) a stop token
        # tokens up to and including the first stop token are the completion
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
                       texts=decode_completions(tok, completion_ids, completion_mask, self.stop_ids),
                       group_size=group_size)

    @torch.no_grad()
    def generate_ids(self, contexts: list[list[int]], *, max_new_tokens: list[int], temperature: float,
                     top_p: float = 1.0, greedy: bool = False) -> list[tuple[list[int], list[float], bool]]:
        """One sampled continuation of each token-id context (a multi-turn episode's next model turn: token in,
        token out, nothing decoded and re-encoded), at most ``max_new_tokens[i]`` tokens for row i. Returns per
        row (ids up to and including the first stop token, their behaviour logprobs, truncated: no stop token
        within the row's budget). The rows are left-padded into one batch and sampled in one ``generate`` call of
        the largest budget; a row's tokens past its own budget are dropped, which is the same distribution as
        sampling it alone with that budget (a token's draw never depends on later ones). ``greedy``: argmax
        (an eval through an environment), logprobs 0 as :meth:`generate` gives them."""
        tok, model = self.tok, self.model
        device = next(model.parameters()).device
        P = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), P), tok.pad_token_id, dtype=torch.long)  # (N, P) left-padded
        mask = torch.zeros(len(contexts), P, dtype=torch.long)  # (N, P)
        for i, c in enumerate(contexts):
            ids[i, P - len(c):] = torch.tensor(c, dtype=torch.long)
            mask[i, P - len(c):] = 1
        ids, mask = ids.to(device), mask.to(device)
        config = sampling_config(max_new_tokens=max(max_new_tokens), eos_token_id=list(self.stop_ids),
                                 pad_token_id=tok.pad_token_id)
        processors, recorder = sampling_processors(temperature, top_p, greedy)
        was_training = model.training
        model.eval()
        try:
            with (self.gather() if self.gather is not None else nullcontext()), autocast(self.amp, device.type), \
                    _only_this_config(model, config):
                sequences = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                           logits_processor=processors)  # (N, P+T)
        finally:
            model.train(was_training)
        out_ids = sequences[:, P:]  # (N, T)
        logp = (torch.zeros(out_ids.shape) if recorder is None else recorder.logprobs(out_ids)).cpu().tolist()  # (N, T)
        stops = set(self.stop_ids)
        out = []
        for i, row in enumerate(out_ids.cpu().tolist()):
            row, lp = row[:max_new_tokens[i]], logp[i][:max_new_tokens[i]]
            end = next((j + 1 for j, t in enumerate(row) if t in stops), None)
            out.append((row, lp, True) if end is None else (row[:end], lp[:end], False))
        return out
