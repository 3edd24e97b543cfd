"""``calculator``: a tool environment: the model may call a calculator before it answers.

The tool-call format is Qwen2.5's (its chat template's system text asks for it, and its template renders an
assistant's ``tool_calls`` so): a JSON object inside ``<tool_call>`` tags, anywhere in the turn,

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "123 * 456"}}
    </tool_call>

``arguments`` may also be a JSON string holding that object (OpenAI's wire form). Each call's result comes back
as one ``tool`` message, its content the number (``56088``) or ``error: <why>``; Qwen2.5's template renders
it as ``<tool_response>...</tool_response>`` inside a user turn, a plain ChatML template as a ``tool`` turn.

A turn:
- with one or more complete ``<tool_call>...</tool_call>`` blocks (at most ``max_calls_per_turn`` are run; more
  are an error each): the calls run, their results are the observation, reward 0, not done. A malformed call
  (bad JSON, an unknown tool, no expression, a ``<tool_call>`` left open after the complete ones) is a parse
  error; an expression the calculator refuses (syntax, division by zero, out of bounds) is an execution error.
  Both are returned to the model as text and counted in ``info``;
- without one: the episode ends and the turn is scored by the task's reward (``task.reward(text, example,
  truncated)``): the final answer is read as the task reads it (rftlib.rewards.math: the last ``\\boxed{}``,
  else the last number). ``stop`` is ``answer`` when the turn holds a ``\\boxed{}``, else ``void`` (neither a
  complete tool call nor a final answer: SimpleTIR's void turn, counted as ``void_turns``; a lone unclosed
  ``<tool_call>`` is such a turn, and also counts as a parse error: its answer is read from the text before the
  tag, never from the call's arguments. Session 10's calc-cpu run found the hole this closes: after 10 GRPO steps
  every held-out success was the tool's result echoed as a new, unclosed call, ``<tool_call>{..."expression":
  "1920"}}``, which the last-number rule read as the answer);
- cut by the token budget (``truncated``): the episode ends, no call runs, the task's reward scores it as a
  truncated completion, ``stop`` is ``length``.
Only the model's last turn reaches the reward; the tool's output never does.

The calculator evaluates arithmetic WITHOUT exec or eval: the expression is parsed (``ast.parse`` in ``eval``
mode: parsing runs no code) and the tree walked, allowing only numbers (int, float) and ``+ - * / // % **``
with unary ``+ -`` and parentheses. Bounds keep every call small whatever the model writes: the expression's
length (``max_chars``), its node count, an exponent's size and the digits of every intermediate result are
capped before the work is done (``2 ** 10**9`` is refused, not computed). So the tool needs no timeout of its
own. A tool that can hang bounds its own calls (the python tool below: ``python_timeout_s``); the rollout source
caps each observation's tokens (``max_observation_tokens``) and keeps the episodes' clock between turns
(``max_episode_seconds``).

With ``python=True`` (``env_args: {python: true}``) a second tool runs Python in the sandbox the code reward uses
(rftlib.rewards.sandbox: its own uid and namespaces, seccomp, Landlock, rlimits, a wall clock; the process-wide
pool of rftlib.rewards.code.default_sandbox), never in the trainer's process:

    <tool_call>
    {"name": "python", "arguments": {"code": "print(123 * 456)"}}
    </tool_call>

Its result is what the program printed (stdout, then stderr), or ``error: <why>`` with the output so far; a program
still running at ``python_timeout_s`` is killed with everything it started, and the model reads ``error: timed
out``: the episode goes on. Each call is a job of its own: nothing one call writes is seen by the next (or by
another row's). The sandbox caps what comes back; the rollout source's observation cap then applies.

Info counts (per step; the source sums them over the episode): ``tool_calls``, ``tool_ok``,
``tool_parse_errors``, ``tool_exec_errors``, ``tool_timeouts`` (a python call killed at its clock; also an exec
error), ``void_turns``; the task reward's diagnostics on the last step.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from dataclasses import dataclass
from typing import Any

from rftlib.envs.base import STOP_ANSWER, STOP_LENGTH, STOP_VOID, Message, Step
from rftlib.rewards.code import default_sandbox
from rftlib.rewards.math import extract_answer
from rftlib.rewards.registry import as_reward
from rftlib.rewards.sandbox import Job

TOOL_NAME = "calculator"
BOXED = 2  # rftlib.rewards.math.extract_answer's parse_method for a \boxed{} answer

MAX_CHARS = 200  # an expression longer than this is refused (a product of two 40-digit numbers fits)
MAX_NODES = 100  # syntax-tree nodes: bounds the walk's work and depth
MAX_DIGITS = 100  # digits of any integer result, intermediate ones included (10**99 fits, a googol does not)
MAX_EXPONENT = 1000  # |exponent| of **; with MAX_DIGITS this bounds a power before it is computed

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)  # a complete call; non-greedy: several per turn

SYSTEM_PROMPT = (
    "You can use a calculator. To call it, write exactly\n"
    "<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "<arithmetic>"}}\n'
    "</tool_call>\n"
    "and stop; its result comes back to you. It evaluates numbers with + - * / // % ** and parentheses.\n"
    "Example: to compute 123 * 456, call it with the expression \"123 * 456\".\n"
    "When you know the answer, write it as \\boxed{answer}."
)
"""the tool's use, shown to the model in the system prompt (after the task's own system prompt, if any)"""


class CalcError(ValueError):
    """An expression the calculator refuses: its message is what the model reads after ``error: ``."""


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


@dataclass(frozen=True)
class Bounds:
    """The calculator's limits (module constants by default)."""

    max_chars: int = MAX_CHARS
    max_nodes: int = MAX_NODES
    max_digits: int = MAX_DIGITS
    max_exponent: int = MAX_EXPONENT


def _digits(x: int) -> int:
    """Decimal digits of |x|. Exact, and cheap: no int larger than about twice max_digits is ever made (every
    operand is checked, and a power is refused from its logarithm before it is computed)."""
    return len(str(abs(x)))


def _checked(x: int | float, b: Bounds) -> int | float:
    if isinstance(x, float) and not math.isfinite(x):
        raise CalcError("result is not a finite number")
    if isinstance(x, int) and _digits(x) > b.max_digits:
        raise CalcError(f"result has more than {b.max_digits} digits")
    return x


def _power(base: int | float, exp: int | float, b: Bounds) -> int | float:
    """base ** exp, refused before it is computed when the exponent or the result would be too large."""
    if abs(exp) > b.max_exponent:
        raise CalcError(f"exponent {exp:g} is larger than {b.max_exponent}")
    if base == 0 and exp < 0:
        raise CalcError("zero to a negative power")
    size = abs(base)
    if size > 1 and exp > 0 and exp * math.log10(size) > b.max_digits:  # the result's digits, from logs
        raise CalcError(f"result has more than {b.max_digits} digits")
    if isinstance(base, (int, float)) and base < 0 and isinstance(exp, float) and not exp.is_integer():
        raise CalcError("a negative number to a fractional power")
    return base ** exp


def _walk(node: ast.AST, b: Bounds) -> int | float:
    if isinstance(node, ast.Expression):
        return _walk(node.body, b)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # bool, complex, str: refused
        return _checked(node.value, b)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand, b))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left, b), _walk(node.right, b)
        op = type(node.op)
        if op is ast.Pow:
            return _checked(_power(left, right, b), b)
        if op in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
            raise CalcError("division by zero")
        return _checked(_BINARY[op](left, right), b)
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise CalcError(f"only numbers and + - * / // % ** are allowed, not {what}")


def evaluate(expression: str, bounds: Bounds = Bounds()) -> int | float:
    """The value of an arithmetic ``expression`` (numbers, ``+ - * / // % **``, unary ``+ -``, parentheses),
    by walking its syntax tree: nothing is executed. CalcError (its message for the model) otherwise."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalcError("empty expression")
    if len(expression) > bounds.max_chars:
        raise CalcError(f"expression longer than {bounds.max_chars} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:  # ValueError: a NUL byte
        raise CalcError(f"cannot parse {expression.strip()!r}: {getattr(e, 'msg', None) or e}") from None
    if sum(1 for _ in ast.walk(tree)) > bounds.max_nodes:
        raise CalcError(f"expression has more than {bounds.max_nodes} parts")
    try:
        return _walk(tree, bounds)
    except (OverflowError, ZeroDivisionError) as e:  # float ** float overflow; 0.0 ** -1
        raise CalcError(str(e)) from None


def format_number(x: int | float) -> str:
    """The result as the model reads it: an int as is; a float to 12 significant digits, written as an int
    when it is one (``6 / 3`` gives ``2``, ``7 / 2`` gives ``3.5``)."""
    if isinstance(x, float):
        if x.is_integer() and abs(x) < 1e15:
            return str(int(x))
        return f"{x:.12g}"
    return str(x)


PYTHON_TOOL = "python"
PYTHON_TIMEOUT_S = 5.0  # a python call's wall clock in the sandbox


@dataclass
class ToolCall:
    """One parsed call: the calculator's expression (or, with ``tool == "python"``, the program in ``code``), or
    the parse error to report."""

    expression: str | None
    error: str | None = None
    complete: bool = True
    """False for a ``<tool_call>`` never closed (not a complete call: the turn may be void)"""
    tool: str = TOOL_NAME
    code: str | None = None


def parse_tool_calls(text: str, tools: tuple[str, ...] = (TOOL_NAME,)) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of ``text`` in order, parsed (the module docstring gives the
    format) against the ``tools`` offered; a ``<tool_call>`` left unclosed after the last complete one is one more
    call, with a parse error. [] when the text holds no ``<tool_call>`` at all."""
    calls = [_parse_one(m.group(1), tools) for m in _CALL.finditer(text)]
    tail = text[text.rfind("</tool_call>") + len("</tool_call>"):] if calls else text
    if "<tool_call>" in tail:
        calls.append(ToolCall(None, "<tool_call> is not closed by </tool_call>", complete=False))
    return calls


def _parse_one(body: str, tools: tuple[str, ...] = (TOOL_NAME,)) -> ToolCall:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as e:
        return ToolCall(None, f"the tool call is not valid JSON ({e.msg if hasattr(e, 'msg') else e})")
    if not isinstance(obj, dict):
        return ToolCall(None, 'the tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = obj.get("name")
    if name not in tools:
        offered = " and ".join(repr(t) for t in tools)
        return ToolCall(None, f"unknown tool {name!r}; the tools are {offered}" if len(tools) > 1
                        else f"unknown tool {name!r}; the only tool is {offered}")
    args = obj.get("arguments")
    if isinstance(args, str):  # OpenAI's wire form: the arguments object as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(None, "arguments is a string that is not a JSON object")
    if name == PYTHON_TOOL:
        if not isinstance(args, dict) or not isinstance(args.get("code"), str):
            return ToolCall(None, 'arguments must be {"code": "<python>"}', tool=name)
        return ToolCall(None, tool=name, code=args["code"])
    if not isinstance(args, dict) or not isinstance(args.get("expression"), str):
        return ToolCall(None, 'arguments must be {"expression": "<arithmetic>"}')
    return ToolCall(args["expression"])


PYTHON_PROMPT = (
    "\nYou can also run Python: write\n"
    "<tool_call>\n"
    '{"name": "python", "arguments": {"code": "print(123 * 456)"}}\n'
    "</tool_call>\n"
    "and what it prints comes back to you."
)
"""added to the tool's use in the system prompt when the python tool is offered"""


def run_python(code: str, timeout_s: float, sandbox=None) -> tuple[str, dict[str, float]]:
    """``code`` run as one sandboxed job (rftlib.rewards.sandbox; the process-wide pool unless ``sandbox``):
    (what the model reads, counts). Printed output on success; ``error: <why>`` and the output so far otherwise
    (a program still running at ``timeout_s`` is killed with its descendants: ``tool_timeouts``)."""
    run = (sandbox or default_sandbox()).run(Job(code, timeout_s=timeout_s))
    out = run.stdout + (("\n" if run.stdout and not run.stdout.endswith("\n") else "") + run.stderr
                        if run.stderr else "")
    if run.stdout_truncated or run.stderr_truncated:
        out += "\n[output truncated by the sandbox]"
    if run.status == "ok":
        return (out if out.strip() else "(no output)"), {"tool_ok": 1.0}
    why = "timed out" if run.timed_out else (run.error or run.status)
    counts = {"tool_exec_errors": 1.0, **({"tool_timeouts": 1.0} if run.timed_out else {})}
    return f"error: {why}" + (f"\n{out}" if out.strip() else ""), counts


class CalculatorEnv:
    """The calculator tool environment for a math ``task`` (the module docstring gives the rules).

    ``reward``: what scores the final turn (default the task's own reward); ``system_prompt``: the tool's use
    shown to the model (appended to the task's own system prompt); ``max_calls_per_turn``: calls run per turn;
    ``bounds``: the calculator's limits."""

    def __init__(self, task: Any, reward: Any = None, *, system_prompt: str = SYSTEM_PROMPT,
                 max_calls_per_turn: int = 4, bounds: Bounds = Bounds(), python: bool = False,
                 python_timeout_s: float = PYTHON_TIMEOUT_S, sandbox: Any = None):
        if max_calls_per_turn < 1:
            raise ValueError(f"calculator: max_calls_per_turn={max_calls_per_turn}; it must be at least 1")
        if python_timeout_s <= 0:
            raise ValueError(f"calculator: python_timeout_s={python_timeout_s}; it must be positive")
        self.task = task
        self.reward = as_reward(reward if reward is not None else task.reward)
        self.system_prompt = system_prompt + (PYTHON_PROMPT if python else "")
        self.max_calls_per_turn = max_calls_per_turn
        self.bounds = bounds
        self.tools = (TOOL_NAME, PYTHON_TOOL) if python else (TOOL_NAME,)
        self.python_timeout_s = python_timeout_s
        self.sandbox = sandbox
        self.example = None

    def reset(self, example: Any, seed: int) -> list[Message]:
        """[system (the task's system prompt, then the tool's use, unless the task's already holds it: a task
        whose prompt is the tool's, for an SFT warm start on the same rendering), user (the problem)]; no
        randomness."""
        self.example = example
        own = getattr(self.task, "system_prompt", None)
        base, extra = SYSTEM_PROMPT, self.system_prompt[len(SYSTEM_PROMPT):]
        if own and self.system_prompt.startswith(base) and base in own:  # the task's prompt is the calculator's
            system = own if extra in own else own + extra  # (python: its part appended once)
        else:
            system = "\n\n".join(p for p in (own, self.system_prompt) if p)
        return [{"role": "system", "content": system}, {"role": "user", "content": example.prompt}]

    def step(self, assistant_text: str, *, truncated: bool = False) -> Step:
        if self.example is None:
            raise RuntimeError("calculator: step() before reset()")
        calls = [] if truncated else parse_tool_calls(assistant_text, self.tools)
        if not any(c.complete for c in calls):  # no complete call: the final turn (a lone open tag is void)
            # the answer is read from the turn's text before an unclosed <tool_call>: a number among a call's
            # arguments is not an answer (RL found that echoing the tool's result as a new, unclosed call scored)
            answer_text = assistant_text[:assistant_text.find("<tool_call>")] if calls else assistant_text
            return self._final(answer_text, truncated, parse_errors=float(bool(calls)))
        counts = {"tool_calls": 0.0, "tool_ok": 0.0, "tool_parse_errors": 0.0, "tool_exec_errors": 0.0}
        out: list[Message] = []
        for i, call in enumerate(calls):
            counts["tool_calls"] += 1
            if i >= self.max_calls_per_turn:
                counts["tool_parse_errors"] += 1
                out.append(_tool(f"error: at most {self.max_calls_per_turn} calls per turn; this one was not run"))
            elif call.error is not None:
                counts["tool_parse_errors"] += 1
                out.append(_tool(f"error: {call.error}", call.tool))
            elif call.tool == PYTHON_TOOL:
                text, got = run_python(call.code, self.python_timeout_s, self.sandbox)
                for k, v in got.items():
                    counts[k] = counts.get(k, 0.0) + v
                out.append(_tool(text, PYTHON_TOOL))
            else:
                try:
                    result = format_number(evaluate(call.expression, self.bounds))
                except CalcError as e:
                    counts["tool_exec_errors"] += 1
                    out.append(_tool(f"error: {e}"))
                else:
                    counts["tool_ok"] += 1
                    out.append(_tool(result))
        return Step(out, 0.0, False, counts)

    def _final(self, text: str, truncated: bool, parse_errors: float = 0.0) -> Step:
        """The turn without a complete tool call (or cut by length): the task's reward of the model's own text."""
        reward, diags = self.reward(text, self.example, truncated)
        boxed = extract_answer(text)[1] == BOXED
        stop = STOP_LENGTH if truncated else (STOP_ANSWER if boxed else STOP_VOID)
        info = {**diags, "void_turns": float(stop == STOP_VOID), "tool_parse_errors": parse_errors, "stop": stop}
        return Step([], float(reward), True, info)


def _tool(content: str, name: str = TOOL_NAME) -> Message:
    return {"role": "tool", "name": name, "content": content}
