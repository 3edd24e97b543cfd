"""Token-in, token-out: an environment's messages as the tokens to append after the model's turn.

A multi-turn trajectory is built from tokens, never from re-encoded text: the prompt's tokens (the chat
template's rendering of the opening messages, generation prompt included: what rftlib.eval.format_prompts and
the engines use today), then each model turn exactly as the engine sampled it, ending with its stop token, then
each environment answer as :func:`env_span` renders it, and so on. Decoding the model's ids and encoding them
again can change them (a different BPE split at a boundary, a normalised space: trl #5224, OpenRLHF #1128),
and the trainer would then score tokens the model never sampled.

:func:`env_span` renders the conversation so far (an assistant message last) and the same conversation with the
environment's messages and the generation prompt appended, checks that the tokens up to the model's stop token
are identical in both, and returns the rest: everything the template puts after that stop token. That includes
the boundary tokens the engine never generates: with ChatML (SmolLM2, Qwen2.5) the model stops at
``<|im_end|>`` and the template goes on with ``\\n``, so the span starts with that newline (verl #3720, trl #5317
lost or double-counted it). The whole span is the environment's: mask 0, no logprob (rftlib.envs.trajectory).
The cut is after a special token, which no BPE merge crosses, so the span's tokens do not depend on how the
model's text would re-encode.

A template that is not prefix-preserving (one more message changes tokens already rendered: Qwen3 drops the
``<think>`` of assistant turns before the last user message, prime-rl #1334, SkyRL #104) cannot be trained
token-in/token-out: what the model saw would not be what a re-render shows. :func:`check_prefix_preserving` is
the start-up check that refuses one, naming the model and the first differing position; :func:`env_span` makes
the same check on every call, on the real conversation.

Tokenizer calls only (``apply_chat_template`` to text, then the tokenizer without special tokens added, as the
engines encode prompts); no torch.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from rftlib.envs.base import Message

PROBE_USER = "What is 2 + 2?"
PROBE_ASSISTANT = "<think>\nI add 2 and 2.\n</think>\n\nThe answer is \\boxed{4}."
"""an assistant turn with reasoning in <think> tags: what a template that drops earlier reasoning changes"""
PROBE_FOLLOWUPS: tuple[Message, ...] = ({"role": "user", "content": "And 3 + 3?"},
                                        {"role": "tool", "content": "6"})
"""the messages an environment appends: feedback as a user turn, a tool's result as a tool turn"""


class TemplateError(ValueError):
    """A chat template that token-in/token-out cannot use (not prefix-preserving, no stop token to cut after)."""


def model_name(tok: Any) -> str:
    """The tokenizer's model, for messages: its ``name_or_path``, else its class name."""
    return getattr(tok, "name_or_path", "") or type(tok).__name__


def render_ids(tok: Any, messages: Sequence[Message], *, add_generation_prompt: bool) -> list[int]:
    """The chat template's rendering of ``messages`` as token ids: the text ``apply_chat_template`` gives,
    encoded without added special tokens (the engines' own encoding of a prompt)."""
    text = tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def first_difference(before: Sequence[int], after: Sequence[int]) -> int | None:
    """The first position where ``after`` does not continue ``before`` (a differing token, or ``after`` ending
    first); None when ``before`` is a prefix of ``after``."""
    for i, t in enumerate(before):
        if i >= len(after) or after[i] != t:
            return i
    return None


def stop_cut(ids: Sequence[int], stop_ids: Iterable[int]) -> int | None:
    """The position just after the last stop token in ``ids``; None when there is none."""
    stops = set(stop_ids)
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] in stops:
            return i + 1
    return None


def _stops(tok: Any, stop_ids: Iterable[int] | None) -> tuple[int, ...]:
    stops = tuple(stop_ids) if stop_ids is not None else (tok.eos_token_id,)
    if not stops or any(t is None for t in stops):
        raise TemplateError(f"{model_name(tok)}: no stop token ids (the tokenizer has no eos_token_id): pass stop_ids")
    return stops


def _show(tok: Any, ids: Sequence[int], i: int) -> str:
    """Token ``i`` of ``ids`` for a message: its id and text, or "the end"."""
    return f"id {ids[i]} {tok.decode([ids[i]])!r}" if i < len(ids) else "the end of the rendering"


def _not_preserving(tok: Any, what: str, before: Sequence[int], after: Sequence[int], i: int) -> TemplateError:
    return TemplateError(
        f"the chat template of {model_name(tok)} is not prefix-preserving: {what} changes the tokens already "
        f"rendered, first at position {i} ({_show(tok, before, i)} becomes {_show(tok, after, i)}; "
        f"context {tok.decode(list(before[max(0, i - 8):i]))!r}). Multi-turn rollouts append tokens and never "
        "re-render, so the model would be trained on a conversation its template does not produce: use a "
        "template that keeps earlier turns as they were rendered")


def env_span(tok: Any, history: Sequence[Message], messages: Sequence[Message], *,
             stop_ids: Iterable[int] | None = None) -> list[int]:
    """The tokens to append after the model's last turn for the environment's ``messages``: the boundary tokens
    after the model's stop token, the messages as the template renders them, and the generation prompt of the
    next assistant turn. ``history``: the conversation so far as messages, an assistant turn last (its text
    as the engine's ids decode, which the template ends with a stop token); ``stop_ids``: the ids that end a
    model turn (rftlib.rollout.base.stop_token_ids; default the tokenizer's EOS).

    TemplateError when the rendering of ``history`` has no stop token after which to cut, or when appending
    ``messages`` changes the tokens up to that cut (the template is not prefix-preserving: its position is
    named)."""
    if not history or history[-1].get("role") != "assistant":
        raise ValueError("env_span: the conversation so far must end with the model's (assistant) turn")
    stops = _stops(tok, stop_ids)
    before = render_ids(tok, history, add_generation_prompt=False)  # ... <|im_start|>assistant\n...<|im_end|>\n
    cut = stop_cut(before, stops)
    if cut is None:
        raise TemplateError(f"the chat template of {model_name(tok)} renders the assistant turn with none of the "
                            f"stop tokens {list(stops)}: there is no model stop token after which to append")
    after = render_ids(tok, [*history, *messages], add_generation_prompt=True)
    i = first_difference(before[:cut], after)
    if i is not None:
        roles = "+".join(m.get("role", "?") for m in messages) or "no message"
        raise _not_preserving(tok, f"appending the environment's {roles} message(s)", before, after, i)
    return after[cut:]


def check_prefix_preserving(tok: Any, *, stop_ids: Iterable[int] | None = None,
                            roles: Sequence[str] = ("user", "tool")) -> None:
    """Refuse (TemplateError) a chat template where one more message changes earlier tokens, on a probe
    conversation whose assistant turn holds reasoning in ``<think>`` tags:

    1. the prompt (system, user, generation prompt) must survive the assistant's message being rendered after
       it (what the model continued from is what a re-render shows);
    2. the conversation up to the assistant's stop token must survive one more message of each of ``roles``
       (an environment's feedback as a user turn, a tool's result as a tool turn), rendered with the next
       generation prompt (:func:`env_span`'s check).

    The error names the model, the appended message and the first differing position. Run once at start-up,
    before any rollout: a template that fails here would train the model on conversations it never saw."""
    unknown = set(roles) - {m["role"] for m in PROBE_FOLLOWUPS}
    if unknown:
        raise ValueError(f"check_prefix_preserving: no probe message for role(s) {sorted(unknown)}; "
                         f"roles are {[m['role'] for m in PROBE_FOLLOWUPS]}")
    stops = _stops(tok, stop_ids)
    opening = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": PROBE_USER}]
    turn = {"role": "assistant", "content": PROBE_ASSISTANT}
    prompt = render_ids(tok, opening, add_generation_prompt=True)
    answered = render_ids(tok, [*opening, turn], add_generation_prompt=False)
    i = first_difference(prompt, answered)
    if i is not None:
        raise _not_preserving(tok, "rendering the assistant's turn after the generation prompt", prompt, answered, i)
    for msg in (m for m in PROBE_FOLLOWUPS if m["role"] in roles):
        try:
            env_span(tok, [*opening, turn], [msg], stop_ids=stops)
        except TemplateError:
            raise
        except Exception as e:  # a template that cannot render the role at all (raise_exception in Jinja)
            raise TemplateError(f"the chat template of {model_name(tok)} cannot render a {msg['role']!r} message "
                                f"after an assistant turn: {e}") from e
