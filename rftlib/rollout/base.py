"""The rollout engine interface and what every engine returns.

Engines (HF generate here, vLLM on GPUs) differ in speed, not in contract: prompt-major rows,
completions cut at the first stop token (kept, so the model learns to stop), behaviour logprobs of the
sampled tokens under the sampling distribution (temperature applied), truncation flags.

The stop set is :func:`stop_token_ids`, the same for every engine: the tokenizer's EOS plus every id the
model's generation config lists as an end (gpt-oss: ``<|return|>`` and ``<|call|>``; Llama 3:
``<|eot_id|>``). Stopping only at the tokenizer's single EOS let those models run on to max_new_tokens
and marked every completion truncated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Protocol

import torch


@dataclass
class Rollout:
    prompt_ids: torch.Tensor  # (N, P) left-padded prompt tokens, each prompt repeated G times
    prompt_mask: torch.Tensor  # (N, P) float {0,1}
    completion_ids: torch.Tensor  # (N, T) sampled tokens, pad after the stop token
    completion_mask: torch.Tensor  # (N, T) float {0,1}: tokens up to and including the first stop token
    behaviour_logprobs: torch.Tensor  # (N, T) float32 log pi_behaviour(token), 0 where masked
    truncated: torch.Tensor  # (N,) bool: hit max_new_tokens without a stop token
    texts: list[str]  # N decoded completions (special tokens kept but the ending stop token and padding)
    group_size: int  # G
    model_mask: torch.Tensor | None = None
    """(N, T) float {0,1}: 1 where the model sampled the token, 0 on tokens it did not write (a multi-turn
    rollout's environment tokens: tool output, the turn-boundary tokens the engine never generates). A subset of
    ``completion_mask``, which keeps meaning "a real token of the completion side" (attention, positions and
    trimming need every real token). The loss, its token and sequence totals, KL, entropy, the clip/ratio
    statistics and TIS read this mask (docs/design-multiturn.md sec. 5.3). Not given (every single-turn engine):
    ``completion_mask`` itself, the same tensor, so nothing downstream changes by a bit."""

    def __post_init__(self):
        if self.model_mask is None:
            self.model_mask = self.completion_mask
        elif self.model_mask.shape != self.completion_mask.shape:
            raise ValueError(f"Rollout.model_mask has shape {tuple(self.model_mask.shape)}, completion_mask "
                             f"{tuple(self.completion_mask.shape)}: they must be the same (N, T)")

    @property
    def num_rows(self) -> int:
        return self.completion_ids.shape[0]

    def lengths(self) -> torch.Tensor:
        """(N,) real completion-side tokens per row: the model's and the environment's (what a trajectory's token
        budget and the overlong penalty count)."""
        return self.completion_mask.sum(-1)  # (N,)

    def model_lengths(self) -> torch.Tensor:
        """(N,) tokens the model sampled per row (``response_length_*``: what the model wrote)."""
        return self.model_mask.sum(-1)  # (N,)

    def to(self, device: torch.device) -> "Rollout":
        """The same rollout with its tensors on ``device`` (an engine on another device, e.g. vLLM's host output)."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), torch.Tensor)})


class RolloutEngine(Protocol):
    shares_trainer_module: bool  # True: samples come from the trainer's own module (no old-logprob pass, no TIS)

    def generate(self, prompts: list[str], *, group_size: int, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, greedy: bool = False) -> Rollout:
        """Sample group_size completions for each chat-formatted prompt (rows prompt-major)."""
        ...

    def sync_weights(self, model, adapter_state: dict | None = None, *, push: bool = True,
                     barrier=None, verify: bool = False) -> dict:
        """Make the engine sample from the trainer's current weights (no-op when they share them).

        ``adapter_state``: trainable tensors gathered whole (ZeRO-3); ``push``/``barrier``: an engine shared
        across ranks is loaded by one rank while the others wait; ``verify``: first check that the engine
        follows a non-zero adapter at all (rftlib.rollout.vllm).
        Returns {seconds, bytes, probe_max_diff}; raises rftlib.rollout.SyncProbeError on stale weights."""
        ...

    def close(self) -> None:
        """Release the engine (stop server processes, free memory)."""
        ...


def stop_token_ids(tok, generation_eos: int | Iterable[int] | None = None) -> tuple[int, ...]:
    """The ids that end a completion: the tokenizer's EOS, then each id of ``generation_eos`` (the model's
    ``generation_config.eos_token_id``: an int, a list, or None), in that order, without repeats."""
    extra = [generation_eos] if isinstance(generation_eos, int) else list(generation_eos or [])
    out: list[int] = []
    for t in [tok.eos_token_id, *extra]:
        if t is not None and int(t) not in out:
            out.append(int(t))
    if not out:
        raise ValueError("neither the tokenizer nor the model's generation config names an end-of-sequence token")
    return tuple(out)


def model_stop_token_ids(tok, model) -> tuple[int, ...]:
    """:func:`stop_token_ids` for a loaded model (a peft wrapper forwards ``generation_config``)."""
    gen = getattr(model, "generation_config", None)
    return stop_token_ids(tok, getattr(gen, "eos_token_id", None))


def decode_completions(tok, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                       stop_ids: Iterable[int] = ()) -> list[str]:
    """N texts: each row's sampled tokens with special tokens kept, but for the stop token that ended it
    and any padding (pad/EOS/stop ids carry no text a reward should read; Harmony's ``<|channel|>``,
    ``<|message|>``, ``<|end|>``, ``<|start|>`` do, and ``skip_special_tokens`` would drop them)."""
    drop = {t for t in (tok.eos_token_id, tok.pad_token_id, *stop_ids) if t is not None}
    rows = []
    for ids, mask in zip(completion_ids.tolist(), completion_mask.tolist()):
        rows.append([t for t, m in zip(ids, mask) if m > 0 and t not in drop])
    return tok.batch_decode(rows, skip_special_tokens=False)


def transcript_spans(tok, completion_ids: torch.Tensor, completion_mask: torch.Tensor, model_mask: torch.Tensor,
                     stop_ids: Iterable[int] = ()) -> list[list[dict[str, str]]]:
    """N transcripts of a multi-turn rollout: each row's completion side as the runs of tokens the model sampled
    (``who`` "model") and the environment put there (``who`` "env": tool output and the turn-boundary tokens of
    the chat template), each run decoded with special tokens kept, as :func:`decode_completions` decodes; a model
    run drops the stop token that ended its turn. What the report and the eval files show, so a reader sees which
    words the model wrote and which it was given (the loss reads only the first)."""
    drop = {t for t in (tok.eos_token_id, tok.pad_token_id, *stop_ids) if t is not None}
    out = []
    # (N, T) each: ids, real-token mask, model-token mask
    for ids, real, mine in zip(completion_ids.tolist(), completion_mask.tolist(), model_mask.tolist()):
        runs: list[tuple[bool, list[int]]] = []
        for t, r, m in zip(ids, real, mine):
            if r <= 0:
                continue
            if not runs or runs[-1][0] != (m > 0):
                runs.append((m > 0, []))
            runs[-1][1].append(t)
        out.append([{"who": "model" if model else "env",
                     "text": tok.decode([t for t in run if t not in drop] if model else run, skip_special_tokens=False)}
                    for model, run in runs])
    return out


def format_prompts(tokenizer, examples, system_prompt: str | None = None) -> list[str]:
    """Chat-formatted prompt text (generation prompt appended) for each example (anything with ``.prompt``: a
    rftlib.data.tasks.Example). In the rollout layer, where the single-turn source renders its prompts;
    rftlib.eval re-exports it."""
    out = []
    for e in examples:
        msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": e.prompt}]
        out.append(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    return out
