"""``multiply``: two-digit by three-digit multiplication, "Calculate 47 * 382." (issue 40 item 6: a task that
learns through its tool on this CPU).

The embedded model (SmolLM2-135M-Instruct) gets almost none of these right unaided: a product of five or six
digits is far past what it computes in its head (arithmetic.py's single-digit sums are its level), and every
digit must be right. With the calculator environment (rftlib.envs.calculator) one well-formed call gives the
product, so the gain comes from learning to call the tool and to report its result: ``calc-cpu`` trains that,
``calc-notool-cpu`` is the same problems without the tool (the arm beside it), ``sft-calc-cpu`` the warm start
on tool-call transcripts (ReTool's cold start) when the model makes no call at step 0.

Problems are drawn with a fixed seed from the 90 x 900 products, a training pool and a disjoint held-out set
(at least 100: issue 40 asks for that many). ``tool_prompt``: the task's system prompt is the calculator's
(rftlib.envs.calculator.SYSTEM_PROMPT), so an SFT warm start on this task renders the prompt the environment
shows (CalculatorEnv does not repeat it); off for the no-tool arm.

``python -m rftlib.data.multiply --sft PATH [--rows N] [--direct-share F]`` writes the warm start's rows:
training-pool problems, each as two rows (its tool call, and the boxed answer after the tool's result), or, for a
share F of them, one row that boxes the product without a call.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from rftlib.data.base import Example, Task
from rftlib.envs.calculator import SYSTEM_PROMPT, TOOL_NAME
from rftlib.rewards.math import math_task_reward

POOL = 2000  # problems drawn: the training pool is what is left after the held-out set
SPLIT_SEED = 1234  # the draw and the split: fixed, so held-out numbers of different attempts compare


def all_problems(n: int = POOL, seed: int = SPLIT_SEED) -> list[Example]:
    """``n`` distinct problems a * b, a two-digit and b three-digit, in a fixed order."""
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    out = []
    while len(out) < n:
        a, b = rng.randint(10, 99), rng.randint(100, 999)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        out.append(Example(id=f"{a}*{b}", prompt=f"Calculate {a} * {b}.", answer=str(a * b),
                           meta={"a": a, "b": b, "op": "*"}))
    return out


def multiply_task(eval_size: int = 100, reward_mode: str = "exact", tool_prompt: bool = False) -> Task:
    """Training pool and held-out set, disjoint by construction; the reward reads the last \\boxed{} or number
    (rftlib.rewards.math). ``tool_prompt``: the calculator's system prompt (module docstring)."""
    probs = all_problems()
    if not 0 < eval_size < len(probs):
        raise ValueError(f"eval_size={eval_size}: the multiply task draws {len(probs)} problems; "
                         f"choose 1..{len(probs) - 1}")
    held, train = probs[:eval_size], probs[eval_size:]
    system = SYSTEM_PROMPT if tool_prompt else None
    return Task(name="multiply", train=train, eval=held, reward=math_task_reward(reward_mode), system_prompt=system,
                probes={"id": random.Random(42).sample(train, 100)}, health_skip=("has_boxed",))


def tool_call_text(expression: str) -> str:
    """The one call that answers a problem, in the calculator's format (rftlib.envs.calculator)."""
    body = json.dumps({"name": TOOL_NAME, "arguments": {"expression": expression}})
    return f"<tool_call>\n{body}\n</tool_call>"


def answer_text(product: int) -> str:
    """The final answer after the tool's result, boxed as the task's reward reads it."""
    return f"The product is \\boxed{{{product}}}."


def sft_rows(n: int, seed: int = 0, direct_share: float = 0.0) -> list[dict]:
    """Warm-start rows for ``n`` training-pool problems, the whole episode as ReTool's cold start has it: two rows
    per problem, the call ({"input": the problem, "output": its tool call}) and the answer after the tool's result
    ({"input", "context": [the call, the tool's result], "output": the boxed product}). With the call alone the
    model learned to call and never to answer (100% calls, 0% correct after SFT: it called again every turn).

    ``direct_share``: that share of the problems (spread evenly through the draw: problem i is direct when
    floor((i + 1) * share) passes an integer) is answered without the tool, one row boxing the product. A warm
    start on calls alone decides the tool use before RL starts (calls in 100% of episodes after 6 steps, issue 40's
    session 10); with both kinds it teaches the two formats and RL must learn that the call pays: the model cannot
    multiply two- by three-digit numbers unaided, so its direct answers are wrong, whatever the rows taught."""
    if not 0.0 <= direct_share < 1.0:
        raise ValueError(f"direct_share={direct_share}: a share of the problems in [0, 1)")
    train = multiply_task().train
    picked = random.Random(seed).sample(train, n)
    rows: list[dict] = []
    for i, e in enumerate(picked):
        a, b = e.meta["a"], e.meta["b"]
        if int((i + 1) * direct_share) > int(i * direct_share):
            rows.append({"input": e.prompt, "output": answer_text(a * b)})
            continue
        call = tool_call_text(f"{a} * {b}")
        rows.append({"input": e.prompt, "output": call})
        rows.append({"input": e.prompt, "context": [{"role": "assistant", "content": call},
                                                    {"role": "tool", "content": str(a * b)}],
                     "output": answer_text(a * b)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="write the calc-cpu warm start's SFT rows (tool-call transcripts)")
    p.add_argument("--sft", required=True, help="the JSONL to write")
    p.add_argument("--rows", type=int, default=200, help="problems (two rows each with a call, one without)")
    p.add_argument("--direct-share", type=float, default=0.0, help="the share of problems answered without the tool")
    a = p.parse_args(argv)
    rows = sft_rows(a.rows, direct_share=a.direct_share)
    Path(a.sft).parent.mkdir(parents=True, exist_ok=True)
    Path(a.sft).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {a.sft}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
