"""Seed 003's pure exact-match (EM) math reward: 1.0 when the extracted answer equals the gold, else 0.0.

Pipeline (seed 003 sec. 10, "Answer Extraction Pipeline" and "Answer Normalization"):

1. Harmony: if a gpt-oss response carries channel markers, only its final message is read
   (``_final_span``; the exact rule is in its docstring).
2. The last balanced ``\\boxed{...}`` (also ``\\boxed {...}`` and ``\\fbox{...}``), nested braces
   allowed. A ``\\boxed{`` whose braces never close, or whose content is blank, is not a match;
   the search goes on to the boxed before it.
3. Else the last number-like token ``-?\\d[\\d,]*(?:\\.\\d+)?`` (a trailing comma is dropped).
4. Both answers are normalised (``normalize_answer``), compared as strings, then as numbers
   with an absolute tolerance of 1e-6 (``answers_match``).

No judge, no network, deterministic. The diagnostics are the seed's ``extra_logs`` (sec. 10,
"Extra Logging"), all floats so that they can be stacked into tensors and logged next to
``reward_mean`` (sec. 7, Tier 1: ``correctness``, ``has_boxed``; Tier 3: truncation rate).
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass

from rftlib.rewards.registry import register_reward

NUMERIC_TOL = 1e-6  # absolute tolerance of the numeric fallback (seed 003 sec. 10)
BOXED_FINAL_FRACTION = 0.8  # boxed_in_final: the last \boxed starts in the final 20% of the response (sec. 10)
LONG_RESPONSE_CHARS = 8000  # "long" for the truncation heuristic: ~2/3 of sec. 6's 3072-token budget at ~4 chars/token
MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own per-parse / per-compare timeout (its default; signal-based, main thread)
MODES = ("exact", "math_verify")  # valid values of math_reward(mode=...)

# Harmony (gpt-oss) special tokens; <|message|> opens a message's content, <|channel|> names its channel.
_HARMONY_TOKEN = re.compile(r"<\|(start|end|message|channel|constrain|return|call)\|>")
_HARMONY_TOKENS = tuple(f"<|{k}|>" for k in ("start", "end", "message", "channel", "constrain", "return", "call"))
_HARMONY_STOP = ("<|return|>", "<|call|>")  # the model ended its turn itself: never truncated

_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")  # match ends just after the opening brace
_BRACE = re.compile(r"\\[{}]|[{}]")  # escaped braces \{ \} are matched and skipped, they do not nest
_NUMBER_TOKEN = re.compile(r"-?\d[\d,]*(?:\.\d+)?")  # the seed's last-number fallback, verbatim

_WRAPPER = re.compile(r"\\(?:textbf|text|mathrm|mathbf)\s*\{([^{}]*)\}")  # innermost first; looped for nesting
_THOUSANDS = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d,])")  # 1,000 and 12,345,678 but not 1,2 or 12,34
_LEADING_ZEROS = re.compile(r"(?<![\d.])0+(?=\d)")  # 042 -> 42, 007 -> 7; 0.5 and 0 and 100 untouched
_INT = re.compile(r"[-+]?\d+")
_DECIMAL = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+)")
_FRAC = re.compile(r"(-?)\\frac\{([-+]?(?:\d+\.?\d*|\.\d+))\}\{([-+]?(?:\d+\.?\d*|\.\d+))\}")  # \frac{a}{b}
_FRAC_SHORT = re.compile(r"(-?)\\frac(\d)(\d)")  # \frac12, common in MATH solutions
_SLASH = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+))/([-+]?(?:\d+\.?\d*|\.\d+))")  # a/b

# A response whose last visible character is one of these ended a sentence or a formula.
_SENTENCE_END = frozenset(".!?)]}$\"'*`\u3002")


@dataclass(slots=True)
class MathReward:
    """One response's EM reward and the seed's diagnostics (every numeric field is 0.0 or 1.0,
    except ``parse_method``)."""

    reward: float
    """the training reward: equal to ``correctness`` (pure EM, no partial credit)"""
    correctness: float
    """1.0 if the extracted answer matches the gold, else 0.0"""
    has_answer: float
    """1.0 if an answer was extracted and is non-empty after normalisation"""
    has_boxed: float
    """1.0 if a balanced, non-blank \\boxed{}/\\fbox{} was found in the answer-bearing text"""
    parse_method: float
    """2.0 boxed, 1.0 last-number fallback, 0.0 none"""
    boxed_in_final: float
    """1.0 if the last \\boxed{} starts within the final 20% of the (raw) response"""
    truncated_response: float
    """1.0 if the response was (or looks) truncated; see ``math_reward``"""
    pred: str | None
    """the extracted answer after normalisation; None when has_answer is 0"""

    def diagnostics(self) -> dict[str, float]:
        """The numeric diagnostics, named as the seed's ``extra_logs`` (sec. 10)."""
        return {
            "correctness": self.correctness,
            "has_answer": self.has_answer,
            "has_boxed": self.has_boxed,
            "parse_method": self.parse_method,
            "boxed_in_final": self.boxed_in_final,
            "truncated_response": self.truncated_response,
        }


# ---------------------------------------------------------------------------------------------
# extraction


def _final_span(text: str) -> tuple[int, int]:
    """(start, end) of the answer-bearing part of ``text``: all of it, or a Harmony final message.

    The rule, when ``text`` contains Harmony tokens (``<|start|> <|channel|> <|message|>
    <|constrain|> <|end|> <|return|> <|call|>``):
    - a message's content runs from ``<|message|>`` to the next Harmony token (or the end of the
      text, for a truncated message); its channel is the first word after the ``<|channel|>``
      of the same header (``<|start|>``, ``<|end|>``, ``<|return|>``, ``<|call|>`` reset it);
    - text before the first token, if not blank, is a message of unknown channel (a completion
      that continues a message the prompt opened);
    - the result is the last message on channel ``final``, even an empty one; else the last
      message of any channel; else nothing (an empty span: no answer).
    Without Harmony tokens the whole text is returned.
    """
    if "<|" not in text:  # fast path: plain text
        return 0, len(text)
    tokens = list(_HARMONY_TOKEN.finditer(text))
    if not tokens:
        return 0, len(text)
    first = tokens[0].start()
    last_message = (0, first) if text[:first].strip() else None
    final_message = None
    channel = None
    for k, tok in enumerate(tokens):
        seg_start = tok.end()
        seg_end = tokens[k + 1].start() if k + 1 < len(tokens) else len(text)
        kind = tok.group(1)
        if kind == "channel":
            words = text[seg_start:seg_end].split(None, 1)
            channel = words[0] if words else ""
        elif kind == "message":
            last_message = (seg_start, seg_end)
            if channel == "final":
                final_message = last_message
        elif kind != "constrain":  # start/end/return/call: a new header or the end of a message
            channel = None
    span = final_message or last_message
    return span if span is not None else (len(text), len(text))


def _close_brace(text: str, open_pos: int) -> int:
    """Index of the ``}`` that closes the ``{`` at ``open_pos``, or -1 if it never closes."""
    depth = 0
    for m in _BRACE.finditer(text, open_pos):
        c = m.group()
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return m.start()
    return -1


def _all_closing_braces(text: str) -> dict[int, int]:
    """{open index: close index} for every balanced brace pair, in one pass (a stack)."""
    stack: list[int] = []
    closes: dict[int, int] = {}
    for m in _BRACE.finditer(text):
        c = m.group()
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            closes[stack.pop()] = m.start()
    return closes


def _last_boxed(text: str, start: int = 0, end: int | None = None) -> tuple[str, int] | None:
    """(content, index of its backslash) of the last usable \\boxed{...} in ``text[start:end]``.

    Usable: braces balanced within the span and content not blank. The last opener is tried
    directly (the common case); only if it fails is every brace matched in one pass, so a
    degenerate response with thousands of unclosed ``\\boxed{`` stays linear.
    """
    if end is None:
        end = len(text)
    sub = text[start:end] if (start or end != len(text)) else text
    if "\\boxed" not in sub and "\\fbox" not in sub:
        return None
    opens = list(_BOXED_OPEN.finditer(sub))
    if not opens:
        return None
    last = opens[-1]
    close = _close_brace(sub, last.end() - 1)
    if close >= 0 and sub[last.end():close].strip():
        return sub[last.end():close], start + last.start()
    if len(opens) == 1:
        return None
    closes = _all_closing_braces(sub)
    for m in reversed(opens[:-1]):
        close = closes.get(m.end() - 1, -1)
        if close >= 0 and sub[m.end():close].strip():
            return sub[m.end():close], start + m.start()
    return None


def _extract(response: str) -> tuple[str | None, int, int]:
    """(raw answer or None, parse_method 2/1/0, index in ``response`` of the boxed's backslash or -1)."""
    start, end = _final_span(response)
    boxed = _last_boxed(response, start, end)
    if boxed is not None:
        return boxed[0].strip(), 2, boxed[1]
    numbers = _NUMBER_TOKEN.findall(response, start, end)
    if numbers:
        return numbers[-1].rstrip(","), 1, -1
    return None, 0, -1


def extract_answer(response: str) -> tuple[str | None, int]:
    """(answer, parse_method) from a model response, before normalisation.

    parse_method: 2 = last \\boxed{}, 1 = last number-like token, 0 = nothing found (answer None).
    Harmony responses are read from their final message only (see ``_final_span``).
    """
    answer, method, _ = _extract(response)
    return answer, method


def parse_gold(answer_text: str) -> str:
    """The gold answer inside a dataset's answer field, not yet normalised.

    - GSM8K solution: what follows the last ``####`` (first line only), with every comma removed;
    - MATH solution: the content of its last ``\\boxed{}``;
    - anything else: the string itself, stripped.
    """
    if "####" in answer_text:
        tail = answer_text.rsplit("####", 1)[1].strip()
        return tail.split("\n", 1)[0].strip().replace(",", "")
    boxed = _last_boxed(answer_text)
    if boxed is not None:
        return boxed[0].strip()
    return answer_text.strip()


# ---------------------------------------------------------------------------------------------
# normalisation and comparison


def _peel(s: str) -> str:
    """Strip enclosing $...$ / $$...$$ / \\(...\\) / \\[...\\] and trailing periods, until stable."""
    while True:
        prev = s
        s = s.strip()
        while s.endswith("."):
            s = s[:-1].rstrip()
        if len(s) >= 4 and s.startswith("$$") and s.endswith("$$"):
            s = s[2:-2]
        elif len(s) >= 2 and s[0] == "$" and s[-1] == "$" and "$" not in s[1:-1]:
            s = s[1:-1]  # only a single enclosing pair: "$5$ and $6$" is left alone
        elif len(s) >= 4 and s[0] == "\\" and s[1] in "([" and s[-2] == "\\" and s[-1] == (")" if s[1] == "(" else "]"):
            s = s[2:-2]
        if s == prev:
            return s


def normalize_answer(s: str) -> str:
    """Seed 003's normalisation, applied to prediction and gold alike. In order:

    1. LaTeX wrappers ``\\text{} \\textbf{} \\mathrm{} \\mathbf{}`` replaced by their content
       (innermost first, so nested wrappers also go);
    2. ``\\dfrac`` and ``\\tfrac`` -> ``\\frac``;
    3. all whitespace removed ("collapse whitespace": ``\\frac{1}{ 2 }`` == ``\\frac{1}{2}``);
    4. enclosing ``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]`` and trailing periods
       stripped, repeatedly (``$42$.`` -> ``42``);
    5. thousands commas removed from numbers grouped in threes (``1,000`` -> ``1000``;
       ``1,2`` is a pair and keeps its comma);
    6. leading zeros removed from numbers (``042`` -> ``42``, ``-007`` -> ``-7``; ``0``, ``0.5``
       and ``100`` unchanged).
    """
    if "\\" in s:
        if "\\text" in s or "\\math" in s:
            while True:
                new = _WRAPPER.sub(r"\1", s)
                if new == s:
                    break
                s = new
        if "frac" in s:
            s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = "".join(s.split())
    s = _peel(s)
    if "," in s:
        s = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), s)
    if "0" in s:
        s = _LEADING_ZEROS.sub("", s)
    return s


def _number(s: str) -> float | None:
    """The value of a normalised int, decimal, \\frac{a}{b}, \\frac12 or a/b; None otherwise."""
    if _INT.fullmatch(s) or _DECIMAL.fullmatch(s):
        return float(s)
    m = _FRAC.fullmatch(s) or _FRAC_SHORT.fullmatch(s)
    if m is not None:
        sign, num, den = m.groups()
    else:
        m = _SLASH.fullmatch(s)
        if m is None:
            return None
        sign, (num, den) = "", m.groups()
    d = float(den)
    if d == 0.0:
        return None
    v = float(num) / d
    return -v if sign else v


def _normalized_match(pred: str, gold: str) -> bool:
    """Match of two already-normalised answers: string equality, then numbers within NUMERIC_TOL."""
    if not pred or not gold:
        return False
    if pred == gold:
        return True
    if _INT.fullmatch(pred) and _INT.fullmatch(gold):
        return int(pred) == int(gold)  # exact: floats would merge integers above 2**53
    a = _number(pred)
    if a is None:
        return False
    b = _number(gold)
    return b is not None and abs(a - b) <= NUMERIC_TOL  # inf - inf is nan: never a match


def answers_match(pred: str, gold: str) -> bool:
    """True if two answers agree after ``normalize_answer``: equal strings, or numbers (ints,
    decimals, \\frac{a}{b}, a/b) within an absolute 1e-6. An empty answer never matches.

    ``gold`` is an answer, not a dataset field: pass it through ``parse_gold`` first if needed.
    """
    return _normalized_match(normalize_answer(pred), normalize_answer(gold))


@functools.lru_cache(maxsize=8192)  # each gold is scored against G responses in a row
def _gold(gold: str) -> tuple[str, str]:
    """(parsed gold, normalised gold)."""
    parsed = parse_gold(gold)
    return parsed, normalize_answer(parsed)


# ---------------------------------------------------------------------------------------------
# truncation heuristic and the optional symbolic mode


def looks_truncated(response: str, has_boxed: bool) -> bool:
    """The seed's heuristic for "this response was cut off" when the generator's flag is unknown.

    - A response ending (after trailing whitespace) in ``<|return|>`` or ``<|call|>`` is not
      truncated: the model emitted its own stop token.
    - Otherwise, trailing whitespace and Harmony tokens are stripped, and the response is
      truncated if it is long (>= LONG_RESPONSE_CHARS characters) with no boxed answer, or if it
      ends mid-sentence: its last character is not one of ``. ! ? ) ] } $ " ' * ` 。``
      (a response ending in a letter, a digit, a comma or an operator counts as cut off).
    - An empty response is not truncated.
    """
    s = response.rstrip()
    if "<|" in s:
        if s.endswith(_HARMONY_STOP):
            return False
        while s.endswith(_HARMONY_TOKENS):
            s = s[: s.rindex("<|")].rstrip()
    if not s:
        return False
    if len(response) >= LONG_RESPONSE_CHARS and not has_boxed:
        return True
    return s[-1] not in _SENTENCE_END


_math_verify_module = None


def _import_math_verify():
    """math_verify, imported once on first use; a clear message if it is not installed."""
    global _math_verify_module
    if _math_verify_module is None:
        try:
            import math_verify
        except ImportError as e:
            raise ImportError(
                "math_reward(mode='math_verify') needs the optional package math-verify: "
                "pip install 'math-verify==0.9.0'"
            ) from e
        _math_verify_module = math_verify
    return _math_verify_module


def _math_verify_equal(mv, pred: str, gold: str) -> bool:
    """Symbolic equivalence by math-verify of two raw answers (each read as one LaTeX formula).

    math-verify's timeouts use signal.alarm, which only works in the main thread; elsewhere they
    are turned off. Any failure to parse or compare counts as "not equivalent".
    """
    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = mv.parse(f"${gold}$", parsing_timeout=timeout)
        pred_parsed = mv.parse(f"${pred}$", parsing_timeout=timeout)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(mv.verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    except Exception:  # math-verify raises on inputs sympy cannot handle: no equivalence shown
        return False


# ---------------------------------------------------------------------------------------------
# the reward


def math_reward(response: str, gold: str, *, truncated: bool | None = None, mode: str = "exact") -> MathReward:
    """Seed 003's pure EM reward of one response: reward = correctness, 1.0 or 0.0.

    gold: a plain answer, a GSM8K solution ending in ``#### 42`` or a MATH solution with a
      ``\\boxed{}``; it is read with ``parse_gold``.
    truncated: the generator's own flag (hit the token limit without EOS) when known; None uses
      ``looks_truncated``. It only feeds the ``truncated_response`` diagnostic, never the reward.
    mode: "exact" (seed 003) or "math_verify": exact first; if that fails, math-verify's symbolic
      equivalence of the extracted answer and the gold (so it can only add matches).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    mv = _import_math_verify() if mode == "math_verify" else None

    answer, method, boxed_at = _extract(response)
    pred = normalize_answer(answer) if answer is not None else None
    if not pred:
        pred = None
    gold_parsed, gold_norm = _gold(gold)
    correct = pred is not None and _normalized_match(pred, gold_norm)
    if not correct and mv is not None and pred is not None and gold_norm:
        correct = _math_verify_equal(mv, answer, gold_parsed)

    has_boxed = method == 2
    if truncated is None:
        truncated = looks_truncated(response, has_boxed)
    c = 1.0 if correct else 0.0
    return MathReward(
        reward=c,
        correctness=c,
        has_answer=0.0 if pred is None else 1.0,
        has_boxed=1.0 if has_boxed else 0.0,
        parse_method=float(method),
        boxed_in_final=1.0 if has_boxed and boxed_at >= BOXED_FINAL_FRACTION * len(response) else 0.0,
        truncated_response=1.0 if truncated else 0.0,
        pred=pred,
    )


def batch_math_reward(
    responses: list[str], golds: list[str], truncated: list[bool] | None = None, *, mode: str = "exact"
) -> list[MathReward]:
    """``math_reward`` of each (response, gold[, truncated]) row, in order (N rows, prompt-major)."""
    if len(golds) != len(responses):
        raise ValueError(f"got {len(responses)} responses but {len(golds)} golds; pass one gold per response")
    if truncated is None:
        return [math_reward(r, g, mode=mode) for r, g in zip(responses, golds)]
    if len(truncated) != len(responses):
        raise ValueError(f"got {len(responses)} responses but {len(truncated)} truncated flags")
    return [math_reward(r, g, truncated=bool(t), mode=mode) for r, g, t in zip(responses, golds, truncated)]


# ---------------------------------------------------------------------------------------------
# as a task's reward: reward(completion, example, truncated) -> (reward, diagnostics)


def _task_reward(completion: str, example, truncated: bool, *, mode: str) -> tuple[float, dict[str, float]]:
    """``math_reward`` against ``example.answer`` (any object with an ``answer``: a data Example)."""
    r = math_reward(completion, example.answer, truncated=truncated, mode=mode)
    return r.reward, r.diagnostics()


def math_em_reward(completion: str, example, truncated: bool) -> tuple[float, dict[str, float]]:
    """Seed 003's exact-match reward (boxed, else the last number) with its diagnostics, as a task reward."""
    return _task_reward(completion, example, truncated, mode="exact")


register_reward("math_em", math_em_reward)


def math_task_reward(mode: str = "exact"):
    """The task reward for answer-equivalence ``mode`` (RunConfig.reward_mode): exact | math_verify.

    A module-level function or a ``functools.partial`` of one, so it pickles (reward workers).
    """
    if mode not in MODES:
        raise ValueError(f"reward_mode {mode!r}: choose {' or '.join(MODES)}")
    if mode == "exact":
        return math_em_reward
    _import_math_verify()  # fail at task build, not at the first reward, when it is absent
    return functools.partial(_task_reward, mode=mode)
