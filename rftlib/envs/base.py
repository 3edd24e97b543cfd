"""The environment interface: text in, text out; rftlib owns the tokens (rftlib.envs.chat).

An environment plays one episode against the model. It sees the model's text only, never token ids, and
answers in chat messages; the rollout source renders those messages with the model's chat template and
appends them, with mask 0, after the tokens the engine sampled:

    env = ENVS.get(name)(task=task, **env_args)          # one object per episode (per row)
    messages = env.reset(example, seed)                  # the conversation the model starts from
    while True:
        text = <the model's next turn, sampled after the conversation so far>
        step = env.step(text, truncated=cut_by_length)
        messages, reward, done, info = step              # a Step unpacks as four
        if done: break

- ``reset(example, seed) -> messages``: the opening messages (system, user, ...), as the chat template takes
  them (``{"role": ..., "content": ...}``). Every member of a GRPO group is reset with the same example and
  seed, so all G start from the same state.
- ``step(assistant_text, *, truncated=False) -> Step(messages, reward, done, info)``: the model's turn as the
  engine's ids decode (the ending stop token left out); the messages to append (tool results, feedback; [] when
  done); this turn's reward; whether the episode is over; ``info``: numeric counts for the metrics (summed over
  the turns by the source) and, once done, ``info["stop"]``, why it ended. ``truncated``: the turn was cut by
  the token budget: the environment must end the episode there without running what the turn asked for (a cut
  tool call is not a tool call), and score it as the task scores a truncated completion.

The return of an episode is the sum of its step rewards. What the environment says (a tool's output) reaches
the reward only if the environment passes it: the built-in ones score the model's own last turn.

How it maps onto the peers' interfaces (so their environments can be wrapped): OpenEnv's ``reset()`` /
``step(action) -> StepResult(observation, reward, done)`` is this with the observation rendered as a message;
verifiers' ``MultiTurnEnv.env_response(messages, state) -> (messages, state)`` with ``is_completed`` is ``step``
with the state kept on the object; SkyRL-gym's ``BaseTextEnv.step(action) -> {observations, reward, done,
metadata}`` is ``step`` itself; TRL's ``environment_factory`` object is a tool set that the calculator
environment's parsing (rftlib.envs.calculator) would dispatch to.

Registry: ``ENVS`` (rftlib.algo.registry.Registry), the built-in environments declared at the end of this
module by ``"module:attr"`` and imported on first ``get``, as tasks are (rftlib.data.base). An environment
made elsewhere registers itself: ``ENVS.register("name", factory)``; a factory is called as
``factory(task=task, **env_args)`` and returns an object with ``reset`` and ``step``.

This module is torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

from rftlib.algo.registry import Registry

Message = dict[str, Any]
"""one chat message, as a chat template takes it: {"role": "user" | "assistant" | "tool" | ..., "content": str}"""

STOP_ANSWER = "answer"  # the model gave its final answer (a turn without a tool call)
STOP_LENGTH = "length"  # the turn was cut by the token budget
STOP_VOID = "void"  # a turn with neither a complete tool call nor a final answer (SimpleTIR's void turn)


@dataclass
class Step:
    """What ``Environment.step`` returns; unpacks as ``messages, reward, done, info``."""

    messages: list[Message]
    """the messages to append after the model's turn ([] when done)"""
    reward: float = 0.0
    """this turn's reward; the episode's return is the sum over its turns"""
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    """numeric counts for the metrics (floats, summed over turns); ``stop`` (str) once done"""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.messages, self.reward, self.done, self.info))


class Environment(Protocol):
    """One episode's environment (the module docstring gives the contract)."""

    def reset(self, example: Any, seed: int) -> list[Message]:
        """The opening messages for ``example``; the same (example, seed) gives the same state."""
        ...

    def step(self, assistant_text: str, *, truncated: bool = False) -> Step:
        """The model's turn in, the environment's answer out."""
        ...


def check_messages(messages: Any, where: str) -> list[Message]:
    """``messages`` as a list of {"role": str, "content": str} dicts, else a ValueError naming ``where`` (the
    environment and method that returned them) and the first bad entry."""
    if not isinstance(messages, list):
        raise ValueError(f"{where}: returned {type(messages).__name__}, not a list of messages")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: message {i} is not {{'role': str, 'content': str}}: {m!r}")
    return messages


ENVS = Registry("environment")
"""name -> factory(task=..., **env_args) -> Environment; the built-in ones declared at the end of this module"""


def registered_envs() -> Registry:
    """The environment registry: every built-in environment declared, any registered by a notebook or test."""
    return ENVS


def make_env(name: str, task: Any, **env_args: Any) -> Environment:
    """A fresh environment ``name`` for one episode of ``task`` (its module imported on first use); an unknown
    name is a ValueError listing the registered ones."""
    return ENVS.get(name)(task=task, **env_args)


# ---- the built-in environments, declared once: their factories' "module:attr" (imported on first use) ------
ENVS.declare("single_turn", "rftlib.envs.single_turn:SingleTurnEnv")
ENVS.declare("calculator", "rftlib.envs.calculator:CalculatorEnv")
ENVS.declare("code_feedback", "rftlib.envs.code_feedback:CodeFeedbackEnv")
