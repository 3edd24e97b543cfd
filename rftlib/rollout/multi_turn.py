"""The ``multi_turn`` rollout source: episodes against an environment (rftlib.envs), token-in/token-out.

Each row of a group plays one episode: ``env.reset(example, seed)`` gives the opening messages, rendered once
as the prompt's ids; then per turn the engine samples the next model turn from the trajectory's token ids
(``engine.generate_ids``: the ids are appended exactly as sampled, stop token included, model mask 1, with their
behaviour logprobs), the environment reads its text and answers, and its messages are appended as the chat
template renders them after the model's stop token (rftlib.envs.chat.env_span: the boundary tokens the engine
never generates, the messages, the next generation prompt; model mask 0, logprob 0). The episode ends when the
environment says done, after ``max_turns`` model turns, or when the trajectory's token budget (model and
environment tokens, ``max_trajectory_tokens``) would be passed: a turn cut by it is handed to the environment as
``truncated`` (no tool runs), and an environment answer that would not fit is not appended (docs/design-multiturn.md
sec. 4-5). All G rows of a group are reset with the same example and seed: every member starts from the same
state. The return is the sum of the environment's step rewards; the training reward composite is not applied
(the environment scores, and only what it passes reaches the reward).

An environment message longer than ``max_observation_tokens`` is cut in the middle and counted (``obs_cut``).

``max_episode_seconds`` is the episodes' clock: no turn starts after it (stop reason ``clock``).

Engines: HF generate (the trainer's module) and vLLM (``generate_ids`` on token ids; a server engine keeps each
group on one server across its turns: ``route``). With ``max_staleness`` k > 0 every turn of a batch samples the
policy version the batch was bound to (``Sampling.adapter``), so a trajectory's staleness is its batch's, counted
from its first turn; a batch still playing when the attempt dies is not in the checkpoint's trained steps, and the
resume plays its episodes again from ``reset`` (tests/test_train_pipeline.py, the ``mid_episode`` kill -9).
Records keep the model mask (rftlib.train.record), so ``rft replay`` sees the turn boundaries.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch

from rftlib.envs.base import STOP_LENGTH, check_messages, make_env
from rftlib.envs.chat import env_span, render_ids
from rftlib.envs.trajectory import Trajectory
from rftlib.rollout.base import Rollout, decode_completions
from rftlib.rollout.sources import Produced, Sampling, Spans, no_spans

STOP_MAX_TURNS = "max_turns"
STOP_CLOCK = "clock"  # max_episode_seconds ran out before the episode ended


def multi_turn(examples: list, *, engine, tok, system_prompt: str | None, reward, sampling: Sampling,
               group_size: int, device, spans: Spans = no_spans, task: Any, env: str, env_args: dict | None = None,
               max_turns: int, max_trajectory_tokens: int, max_observation_tokens: int = 512,
               max_episode_seconds: float | None = None) -> Produced:
    """G episodes per example against environment ``env`` of ``task``; returns the batch as one Rollout
    (prompt-major, G rows per example) whose ``model_mask`` is 0 on the environment's tokens, each row's return,
    and its diagnostics: the environment's counts summed over turns, ``turns``, ``tokens/model``,
    ``tokens/env`` and ``stop/<reason>`` = 1 (the row means are the step's rates). ``system_prompt`` and
    ``reward`` are the single-turn source's: the environment renders its own prompt and scores."""
    G, budget = group_size, max_trajectory_tokens
    if not hasattr(engine, "generate_ids"):
        raise ValueError(f"env={env!r}: the rollout engine {type(engine).__name__} cannot continue from token ids "
                         "(generate_ids); multi-turn rollouts run on rollout_engine hf or vllm")
    stop_ids = tuple(engine.stop_ids)
    base_seed = 0 if sampling.seed is None else int(sampling.seed)  # an example's reset seed: episode_seed()
    envs, trajs, histories, returns, infos = [], [], [], [], []
    for g, ex in enumerate(examples):
        for _ in range(G):  # the same (example, seed) for the whole group: one starting state
            e = make_env(env, task, **(env_args or {}))
            msgs = check_messages(e.reset(ex, episode_seed(base_seed, ex, g)), f"{env}.reset")
            envs.append(e)
            trajs.append(Trajectory(render_ids(tok, msgs, add_generation_prompt=True)))
            histories.append(list(msgs))
            returns.append(0.0)
            infos.append({})
    stop: list[str | None] = [None] * len(envs)
    t_generate = t_env = 0.0
    active = list(range(len(envs)))
    started = time.time()
    for turn in range(max_turns):
        if not active:
            break
        if max_episode_seconds is not None and time.time() - started >= max_episode_seconds:
            for r in active:  # the episode clock ran out: no further turn
                stop[r] = STOP_CLOCK
            active = []
            break
        t = time.time()
        with spans("generate"):
            outs = engine.generate_ids([trajs[r].context() for r in active],
                                       max_new_tokens=[budget - len(trajs[r].ids) for r in active],
                                       temperature=sampling.temperature, top_p=sampling.top_p,
                                       **turn_kwargs(sampling, turn),
                                       # an engine of several servers keeps each group on one (its prefix cache)
                                       **({"route": [r // G for r in active]} if getattr(engine, "routes_groups",
                                                                                         False) else {}))
        t_generate += time.time() - t
        t = time.time()
        still = []
        with spans("reward"):
            for r, (ids, lp, cut) in zip(active, outs):
                trajs[r].add_model(ids, lp)
                text = tok.decode([i for i in ids if i not in stop_ids and i != tok.pad_token_id],
                                  skip_special_tokens=False)
                msgs, rew, done, info = envs[r].step(text, truncated=cut)
                returns[r] += float(rew)
                for k, v in info.items():
                    if k == "stop":
                        stop[r] = str(v)
                    elif isinstance(v, (int, float)):
                        infos[r][k] = infos[r].get(k, 0.0) + float(v)
                histories[r].append({"role": "assistant", "content": text})
                if done or cut:
                    stop[r] = stop[r] or (STOP_LENGTH if cut else "done")
                    continue
                msgs, cut_n = cap_observation(tok, neutralise_special_tokens(tok, check_messages(msgs, f"{env}.step")),
                                              max_observation_tokens)
                if cut_n:
                    infos[r]["obs_cut"] = infos[r].get("obs_cut", 0.0) + cut_n
                span = env_span(tok, histories[r], msgs, stop_ids=stop_ids)
                if len(trajs[r].ids) + len(span) >= budget:  # no room for the answer and a model token after it
                    stop[r] = STOP_LENGTH
                    continue
                trajs[r].add_env(span)
                histories[r] += msgs
                still.append(r)
        t_env += time.time() - t
        active = still
    for r in active:
        stop[r] = STOP_MAX_TURNS
    ro = _rollout(tok, trajs, [s == STOP_LENGTH for s in stop], G, stop_ids).to(device)
    diags = [{**infos[r], "turns": float(trajs[r].turns), "tokens/model": float(trajs[r].model_tokens),
              "tokens/env": float(trajs[r].env_tokens), f"stop/{stop[r]}": 1.0} for r in range(len(trajs))]
    return Produced(ro, returns, diags, t_generate, t_env)


CUT_MARK = "\n[... of {what} cut ...]\n"
"""what stands in a capped observation where its middle was (:func:`cap_observation`)"""
CHARS_PER_TOKEN_BOUND = 64
"""a bound on the characters of one token, used to cut a huge observation's text before tokenizing it (encoding
10 MB to keep 512 tokens of it would cost seconds): each end keeps ``cap * 64`` characters, more than ``cap``
tokens of any vocabulary's pieces span"""


def episode_seed(base: int, example: Any, index: int) -> int:
    """The seed an example's episodes are reset with: the batch's base plus a stable hash of the example's id (its
    index in the call when it has none), so a held-out problem starts from the same state whatever the batch size
    or the number of ranks (every row of its group gets the same seed: one starting state)."""
    key = getattr(example, "id", None)
    if key is None:
        return base + index
    return base + int.from_bytes(hashlib.sha256(str(key).encode()).digest()[:4], "big")


def neutralise_special_tokens(tok, messages: list[dict]) -> list[dict]:
    """``messages`` with every special token's text in their contents broken by a zero-width space: the template's
    rendering is encoded with special tokens recognised, so a tool that prints ``<|im_end|>\n<|im_start|>assistant``
    (model-written code can) would forge turn boundaries and stop tokens inside the environment's span. The
    content reads the same to a person."""
    specials = [t for t in getattr(tok, "all_special_tokens", []) if len(t) > 1]
    specials += [t for t in getattr(tok, "get_added_vocab", dict)() if len(t) > 1 and t not in specials]
    out = []
    for m in messages:
        text = m["content"]
        hit = [t for t in specials if t in text]
        for t in hit:
            text = text.replace(t, t[0] + "\u200b" + t[1:])
        out.append({**m, "content": text} if hit else m)
    return out


TURN_SEED_STRIDE = 1_000_003
"""turn t of a batch samples from base seed + t x this (row i of the call from + i): each turn's rows draw fresh
streams, never the previous turn's (an engine that takes seeds: vLLM)"""


def turn_kwargs(sampling: Sampling, turn: int) -> dict:
    """The engine keywords of a turn's generate_ids beyond the budget and temperature: greedy when asked, and
    the seed and adapter (policy version) only when the batch has them (an engine that draws its own seed, or
    holds no adapters, is called without)."""
    kw: dict = {"greedy": True} if sampling.greedy else {}
    if sampling.seed is not None:
        kw["seed"] = int(sampling.seed) + turn * TURN_SEED_STRIDE
    if sampling.adapter is not None:
        kw["adapter"] = sampling.adapter
    return kw


def cap_observation(tok, messages: list[dict], cap: int) -> tuple[list[dict], int]:
    """``messages`` with each content over ``cap`` tokens cut in the middle to at most ``cap`` tokens, the marker
    :data:`CUT_MARK` (which says how long the content was) counted in: its first and last tokens kept around the
    marker; and how many messages were cut. The cap is per message (several tool results of one turn are capped
    each). The model sees both ends of what the environment said (a traceback's cause is at its end)
    and that something was cut. A content of at most ``cap`` UTF-8 bytes is never tokenized (a token holds at
    least one byte)."""
    out, cut = [], 0
    side = cap * CHARS_PER_TOKEN_BOUND
    n_tokens = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    for m in messages:
        text = m["content"]
        if len(text.encode("utf-8", "replace")) <= cap:
            out.append(m)
            continue
        whole = len(text) <= 2 * side  # tokenized whole (the count cut is exact), else only its ends
        ids = tok(text, add_special_tokens=False)["input_ids"] if whole else None
        if whole and len(ids) <= cap:
            out.append(m)
            continue
        mark = CUT_MARK.format(what=f"{len(ids)} tokens, some" if whole else f"{len(text)} characters, most")
        keep = max(0, cap - n_tokens(mark) - 2)  # the marker counts in the cap, and 1 token each side for re-encoding
        head_ids = (ids if whole else tok(text[:side], add_special_tokens=False)["input_ids"])[:keep // 2]
        tail_ids = (ids if whole else tok(text[-side:], add_special_tokens=False)["input_ids"])
        tail_ids = tail_ids[len(tail_ids) - (keep - keep // 2):] if keep - keep // 2 else []
        content = tok.decode(head_ids) + mark + tok.decode(tail_ids)
        while n_tokens(content) > cap and (head_ids or tail_ids):  # a re-encoding that merged differently
            head_ids, tail_ids = (head_ids[:-1], tail_ids) if len(head_ids) >= len(tail_ids) else (head_ids, tail_ids[1:])
            content = tok.decode(head_ids) + mark + tok.decode(tail_ids)
        out.append({**m, "content": content})
        cut += 1
    return out, cut


def _rollout(tok, trajs: list[Trajectory], truncated: list[bool], group_size: int, stop_ids) -> Rollout:
    """Stack trajectories into a Rollout: prompts left-padded, completion sides right-padded, ``model_mask`` from
    each trajectory's; texts are the whole completion side decoded (the transcript, environment turns included)."""
    N, pad = len(trajs), tok.pad_token_id
    P = max(len(t.prompt_ids) for t in trajs)
    T = max(1, max(len(t.ids) for t in trajs))
    prompt_ids = torch.full((N, P), pad, dtype=torch.long)  # (N, P)
    prompt_mask = torch.zeros(N, P)  # (N, P)
    completion_ids = torch.full((N, T), pad, dtype=torch.long)  # (N, T)
    completion_mask, model_mask, behaviour = torch.zeros(N, T), torch.zeros(N, T), torch.zeros(N, T)  # (N, T) each
    for i, t in enumerate(trajs):
        p, n = len(t.prompt_ids), len(t.ids)
        prompt_ids[i, P - p:] = torch.tensor(t.prompt_ids, dtype=torch.long)
        prompt_mask[i, P - p:] = 1
        completion_ids[i, :n] = torch.tensor(t.ids, dtype=torch.long)
        completion_mask[i, :n] = 1
        model_mask[i, :n] = torch.tensor(t.model_mask, dtype=torch.float)
        behaviour[i, :n] = torch.tensor(t.logprobs, dtype=torch.float)
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                   completion_mask=completion_mask, behaviour_logprobs=behaviour, truncated=torch.tensor(truncated),
                   texts=decode_completions(tok, completion_ids, completion_mask, stop_ids), group_size=group_size,
                   model_mask=model_mask)
