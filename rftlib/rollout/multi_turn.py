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

Not yet (issue 40): vLLM engines,
per-row staleness versions, records of the turn boundaries.
"""

from __future__ import annotations

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
                         "(generate_ids); multi-turn rollouts run on rollout_engine hf for now")
    stop_ids = tuple(engine.stop_ids)
    base_seed = 0 if sampling.seed is None else int(sampling.seed)
    envs, trajs, histories, returns, infos = [], [], [], [], []
    for g, ex in enumerate(examples):
        for _ in range(G):  # the same (example, seed) for the whole group: one starting state
            e = make_env(env, task, **(env_args or {}))
            msgs = check_messages(e.reset(ex, base_seed + g), f"{env}.reset")
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
                                       **turn_kwargs(sampling, turn))
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
                msgs, cut_n = cap_observation(tok, check_messages(msgs, f"{env}.step"), max_observation_tokens)
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


CUT_MARK = "\n[... {what} cut ...]\n"
"""what stands in a capped observation where its middle was (:func:`cap_observation`)"""
CHARS_PER_TOKEN_BOUND = 64
"""a bound on the characters of one token, used to cut a huge observation's text before tokenizing it (encoding
10 MB to keep 512 tokens of it would cost seconds): each end keeps ``cap * 64`` characters, more than ``cap``
tokens of any vocabulary's pieces span"""


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
    """``messages`` with each content over ``cap`` tokens cut in the middle: its first ``cap // 2`` and last
    ``cap - cap // 2`` tokens kept, decoded around :data:`CUT_MARK` (which says how much went); and how many
    messages were cut. The model sees both ends of what the environment said (a traceback's cause is at its end)
    and that something was cut. A content of at most ``cap`` UTF-8 bytes is never tokenized (a token holds at
    least one byte)."""
    out, cut = [], 0
    head_n, tail_n = cap // 2, cap - cap // 2
    side = cap * CHARS_PER_TOKEN_BOUND
    for m in messages:
        text = m["content"]
        if len(text.encode("utf-8", "replace")) <= cap:
            out.append(m)
            continue
        if len(text) <= 2 * side:  # tokenized whole: the count cut is exact
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if len(ids) <= cap:
                out.append(m)
                continue
            head, tail, what = ids[:head_n], ids[-tail_n:], f"{len(ids) - cap} tokens"
        else:  # only its ends are tokenized
            head = tok(text[:side], add_special_tokens=False)["input_ids"][:head_n]
            tail = tok(text[-side:], add_special_tokens=False)["input_ids"][-tail_n:]
            what = f"all but {cap} tokens of {len(text)} characters"
        out.append({**m, "content": tok.decode(head) + CUT_MARK.format(what=what) + tok.decode(tail)})
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
