"""Tasks: a training pool, a disjoint held-out set, a prompt and a reward; and their registry.

A task is what one attempt trains on. The trainer sees only this interface, so a new task
(a dataset from disk, a code problem set) plugs in by registering a builder.

Import order, without a loop: this module imports no task builder; the built-in tasks are declared
at its end by their builder's ``"module:attr"`` (one line each), and ``TASKS.get(name)`` imports that
builder's module alone when a config or a run asks for it. A task defined elsewhere (a notebook's, a
test's) registers itself: ``@TASKS.register("name")`` on its builder.
``rftlib.data.tasks`` re-exports all of it for older imports.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from rftlib.algo.registry import Registry
from rftlib.rewards import REWARDS


def normalise_text(text: str) -> str:
    """Whitespace runs collapsed to one space, ends stripped (case kept): the form problems are compared in."""
    return " ".join(text.split())


def problem_hash(problem: str) -> str:
    """MD5 of the problem with whitespace runs collapsed to one space (case kept: x and X differ): a problem's
    identity, the one the prepare pipeline deduplicates and splits by (rftlib.data.prepare)."""
    return hashlib.md5(normalise_text(problem).encode("utf-8")).hexdigest()


def append_instruction(problem: str, instruction: str, sep: str = " ") -> str:
    """``problem`` as a prompt that asks for ``instruction`` (after ``sep``); unchanged when there is none."""
    return f"{problem}{sep}{instruction}" if instruction else problem


@dataclass(frozen=True)
class Example:
    """One problem: the user message shown to the model and the gold answer the reward checks."""

    id: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


class Sampler:
    """A training pool's prompt order behind a resumable state: what the trainer draws each rollout's prompts
    from. A subclass gives ``next``, ``state`` and ``load_state``; one that moves on the measured solve rate (a
    curriculum) declares ``adaptive = True`` and overrides ``update``; ``metrics`` is logged each step. Every
    rank holds the same sampler and draws the same global order (the trainer slices it per rank)."""

    adaptive = False
    """moved by the results: the trainer gathers every rank's (pool index, correctness) into update() each step"""

    def next(self, k: int) -> list[int]:
        """The next ``k`` pool indices."""
        raise NotImplementedError

    def state(self) -> dict:
        """What a checkpoint keeps to resume the order exactly."""
        raise NotImplementedError

    def load_state(self, s: dict) -> None:
        raise NotImplementedError

    def update(self, indices: list[int], correct: list[float]) -> None:
        """Results of the rollout just scored (one entry per sample); only an adaptive sampler uses them."""

    def metrics(self) -> dict[str, float]:
        """Numbers for the step's metrics row (a curriculum's level, a mix's shares); none by default."""
        return {}


@dataclass
class Task:
    """A training pool, a held-out set disjoint from it, and the reward for one completion."""

    name: str
    train: list[Example]
    eval: list[Example]
    reward: Callable[[str, Example, bool], tuple[float, dict[str, float]]]
    """reward(completion_text, example, truncated) -> (reward, numeric diagnostics)"""
    system_prompt: str | None = None
    """None keeps the model's chat-template default"""
    probes: dict[str, list[Example]] = field(default_factory=dict)
    """extra eval sets by name, e.g. id (drawn from the pool) and ood (another distribution)"""
    health_skip: tuple[str, ...] = ()
    """health rules that do not apply to this task (e.g. has_boxed where answers are not boxed)"""
    instruction: str = ""
    """the format instruction the builder appends to every problem (``append_instruction``), "" for none: what
    makes a bare problem one of this task's prompts (``prompt_for``) and what ``problem_of`` strips back off"""
    instruction_sep: str = " "
    """what stands between a problem and its instruction"""

    def __post_init__(self) -> None:
        overlap = {e.prompt for e in self.train} & {e.prompt for e in self.eval}
        if overlap:
            raise ValueError(f"task {self.name}: {len(overlap)} held-out prompts also in the training pool, "
                             f"e.g. {sorted(overlap)[0]!r}")

    def prompt_for(self, text: str) -> str:
        """``text`` as this task shows it to the model: a bare problem (seed 003's SFT rows are) gets the task's
        instruction; a text that already ends with it is returned as it is."""
        if not self.instruction or normalise_text(text).endswith(normalise_text(self.instruction)):
            return text
        return append_instruction(text, self.instruction, self.instruction_sep)

    def problem_of(self, text: str) -> str:
        """The problem in one of this task's prompts (or in a bare problem): the text, whitespace-normalised,
        less the task's instruction at its end."""
        norm, instr = normalise_text(text), normalise_text(self.instruction)
        if instr and norm.endswith(instr) and len(norm) > len(instr):
            return norm[:-len(instr)].rstrip()
        return norm

    def problem_key(self, text: str) -> str:
        """The identity of the problem in ``text``: ``problem_hash`` of ``problem_of`` (a prompt of this task and
        the bare problem it was made from have the same key, as the prepare pipeline's files do)."""
        return problem_hash(self.problem_of(text))

    def guarded_sets(self) -> dict[str, list[Example]]:
        """The eval sets no training data may hold: the held-out set, and every probe that is not drawn from the
        training pool (an "id" probe is, by design; an "ood" probe is not)."""
        train = {self.problem_key(e.prompt) for e in self.train}
        out = {"heldout": self.eval}
        for name, exs in self.probes.items():
            if not all(self.problem_key(e.prompt) in train for e in exs):
                out[name] = exs
        return out

    def make_sampler(self, seed: int) -> Sampler | None:
        """The task's own prompt sampler (a curriculum, weighted mixing: a :class:`Sampler`), or None for the
        trainer's seeded per-epoch order."""
        return None

    def eval_set(self, probe: str) -> list[Example]:
        """The examples of an eval probe: 'heldout' is the held-out split, others come from probes."""
        if probe == "heldout":
            return self.eval
        if probe not in self.probes:
            raise ValueError(f"task {self.name} has no eval probe '{probe}'; it has heldout"
                             + "".join(f", {k}" for k in self.probes))
        return self.probes[probe]


@dataclass(frozen=True)
class Leak:
    """A training text that holds a guarded eval problem (``held_out_leaks``)."""

    index: int  # of the text in the list checked
    text: str
    eval_set: str  # heldout or a probe's name
    example: Example  # the eval problem it holds
    how: str  # "same problem" (equal problem_key) | "contains it" (the eval problem's text inside the row's)


def held_out_leaks(task: Task, texts: list[str]) -> list[Leak]:
    """Every text (an SFT row's input, bare or with any instruction) that holds one of the task's guarded eval
    problems (``Task.guarded_sets``), compared by problem identity, not prompt text: the same ``problem_key``
    (the prepare pipeline's hash, the task's instruction stripped), or the eval problem's whitespace-normalised
    text found inside the row's (another instruction before or after it, another wording around it)."""
    guarded = [(name, e, task.problem_of(e.prompt)) for name, exs in task.guarded_sets().items() for e in exs]
    by_key = {problem_hash(p): (name, e) for name, e, p in guarded}
    out = []
    for i, text in enumerate(texts):
        hit = by_key.get(task.problem_key(text))
        if hit is not None:
            out.append(Leak(i, text, hit[0], hit[1], "same problem"))
            continue
        norm = normalise_text(text)
        found = next(((name, e) for name, e, p in guarded if p and len(p) <= len(norm) and p in norm), None)
        if found is not None:
            out.append(Leak(i, text, found[0], found[1], "contains it"))
    return out


TASKS = Registry("task")
"""name -> builder(**task_args) -> Task; the built-in ones declared at the end of this module"""


def registered_tasks() -> Registry:
    """The task registry: every built-in task declared, a notebook's or a test's registered (nothing imported)."""
    return TASKS


def registered_rewards() -> Registry:
    """The reward registry (rftlib.rewards.registry): those of rftlib.rewards, and those that live beside their
    task (``code_tests``, declared below)."""
    return REWARDS


def build_task(name: str, **kwargs: Any) -> Task:
    """Build a task, passing only the keyword arguments its builder takes (eval_size and
    reward_mode are optional: a builder without them does not get them)."""
    builder = registered_tasks().get(name)
    params = inspect.signature(builder).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return builder(**kwargs)


# ---- the built-in tasks, declared once: their builders' "module:attr" (imported on first use) --------------
for _name, _target in (("arithmetic", "arithmetic:arithmetic_task"), ("gsm8k", "benchmarks:gsm8k_task"),
                       ("code_basics", "code_basics:code_basics_task"),
                       ("code_problems", "code_problems:code_problems_task"), ("mixed", "curriculum:mixed_task"),
                       ("prepared", "prepare:prepared_task"), ("multiply", "multiply:multiply_task")):
    TASKS.declare(_name, f"rftlib.data.{_target}")
# the code task's reward with its batch form (a sandbox map), where the task lives
REWARDS.declare("code_tests", "rftlib.data.code_problems:CODE_TESTS")
