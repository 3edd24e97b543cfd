"""The embedded default task: two-term single-digit addition/subtraction, "Calculate 6 - 2."

Small enough that SmolLM2-135M-Instruct is right about half the time greedily, so GRPO has signal
from the first step, and every problem is enumerable: 10 x 10 x 2 = 200 distinct problems, split
by a seeded shuffle into a training pool and a disjoint held-out set. The phrasing matters a lot
for this model's baseline (measured before this module was written): re-measure if it changes.
"""

from __future__ import annotations

import random

from rftlib.data.base import Example, Task, append_instruction
from rftlib.rewards.math import math_task_reward


def all_problems() -> list[Example]:
    """Every two-term single-digit problem, in a fixed order."""
    out = []
    for a in range(10):
        for b in range(10):
            for op in "+-":
                ans = a + b if op == "+" else a - b
                out.append(Example(id=f"{a}{op}{b}", prompt=f"Calculate {a} {op} {b}.", answer=str(ans),
                                   meta={"a": a, "b": b, "op": op}))
    return out


def arithmetic_task(eval_size: int = 100, seed: int = 1234, reward_mode: str = "exact", instruction: str = "") -> Task:
    """Training pool and held-out set, disjoint by construction (a split of one shuffled list).

    The split seed is fixed independently of the run seed, so held-out numbers of different
    attempts are comparable. ``reward_mode``: exact | math_verify (RunConfig.reward_mode).
    ``instruction``: appended to every prompt (e.g. a \\boxed{} format the base model does not follow:
    params/sft-arithmetic-boxed.yaml); one that names \\boxed makes the has_boxed health rule apply.
    """
    instruction = instruction.strip()
    probs = [Example(e.id, append_instruction(e.prompt, instruction), e.answer, e.meta) for e in all_problems()]
    if not 0 < eval_size < len(probs):
        raise ValueError(f"eval_size={eval_size}: the arithmetic task has {len(probs)} problems; "
                         f"choose 1..{len(probs) - 1}")
    random.Random(seed).shuffle(probs)
    train, held = probs[eval_size:], probs[:eval_size]
    rng = random.Random(42)  # seed 003's probe seed
    ood = []
    for i in range(50):  # out of distribution: two-digit operands, never seen in training
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
        ans = a + b if op == "+" else a - b
        ood.append(Example(id=f"ood{i}:{a}{op}{b}", prompt=append_instruction(f"Calculate {a} {op} {b}.", instruction),
                           answer=str(ans),
                           meta={"a": a, "b": b, "op": op}))
    probes = {"id": rng.sample(train, min(50, len(train))), "ood": ood}
    return Task(name="arithmetic", train=train, eval=held, reward=math_task_reward(reward_mode), probes=probes,
                # SmolLM2 ignores format instructions and the reward reads the last number: no boxes
                health_skip=() if "boxed" in instruction else ("has_boxed",), instruction=instruction)
