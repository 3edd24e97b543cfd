"""Which training problems come next: a solve-rate-driven curriculum, and weighted task mixing.

Seed 002's advice, made mechanical: start where the policy solves 30-50% (``pick_start_level``),
move from easy to hard as the measured solve rate allows, and rotate problem types so that no
batch is one pattern. Both samplers follow the trainer's ``PromptSampler`` interface: ``next(k)``
returns indices into the training pool; ``state()`` / ``load_state()`` make them resumable from a
checkpoint; ``metrics()`` is a flat dict of floats to log next to ``reward_mean``.

CurriculumSampler: each example has a difficulty level (``meta["difficulty"]``) and a type
(``meta["type"]``). Each level keeps an exponential moving average of correctness over the results
fed to ``update``. Once ``min_results`` results have been seen at the current level since the last
move, the level goes up when its average is above ``advance_above`` and down when below
``retreat_below``. A batch draws ``1 - review_frac - lookahead_frac`` of its problems from the
current level, ``review_frac`` from the easier ones (against forgetting) and ``lookahead_frac``
from the next harder one (so its solve rate is known before moving there); within a level, types
are taken in turn.

MixedTask: several tasks as one; ``make_sampler`` deals their examples in proportion to
``weights`` by smooth weighted round-robin (exact proportions, no sampling noise).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

from rftlib.data.base import Example, Sampler, Task, build_task


@dataclass(frozen=True)
class CurriculumConfig:
    advance_above: float = 0.7
    """move up when the current level's moving solve rate is above this (mastered enough)"""
    retreat_below: float = 0.2
    """move down when it is below this: seed 003 sec. 12 calls a solve rate under 5% too sparse and names a
    curriculum as the remedy; 0.2 (rftlib's choice) moves down well before a level gets there"""
    ema: float = 0.05
    """weight of each new result in a level's moving average (memory of ~1/ema = 20 results)"""
    min_results: int = 32
    """results at the current level since the last move before the next move (hysteresis)"""
    review_frac: float = 0.2
    """share of each batch drawn from easier levels, spread evenly over them"""
    lookahead_frac: float = 0.1
    """share of each batch drawn from the next harder level"""
    target_band: tuple[float, float] = (0.3, 0.5)
    """baseline solve rates to start in (seed 002: "start with problems at 30-50% accuracy")"""

    def __post_init__(self):
        if not 0 <= self.retreat_below < self.advance_above <= 1:
            raise ValueError(f"need 0 <= retreat_below < advance_above <= 1, got "
                             f"{self.retreat_below} and {self.advance_above}")
        if not 0 < self.ema <= 1:
            raise ValueError(f"ema must be in (0, 1], got {self.ema}")
        if self.min_results < 1:
            raise ValueError(f"min_results must be >= 1, got {self.min_results}")
        if self.review_frac < 0 or self.lookahead_frac < 0 or self.review_frac + self.lookahead_frac >= 1:
            raise ValueError("review_frac and lookahead_frac must be >= 0 and sum to less than 1")


def pick_start_level(rates: dict[Any, float], band: tuple[float, float] = (0.3, 0.5)) -> Any:
    """The level whose baseline solve rate is nearest the middle of ``band`` (ties: the easier);
    ``rates`` maps level -> measured baseline solve rate."""
    if not rates:
        raise ValueError("no baseline rates given")
    mid = (band[0] + band[1]) / 2
    return min(sorted(rates), key=lambda lv: abs(rates[lv] - mid))


class _Deck:
    """Indices dealt in seeded per-pass permutations (like PromptSampler), one deck per group."""

    def __init__(self, items: list[int]):
        self.items, self.order, self.pos = items, list(items), len(items)

    def draw(self, rng: random.Random) -> int:
        if self.pos >= len(self.order):
            self.order = list(self.items)
            rng.shuffle(self.order)
            self.pos = 0
        self.pos += 1
        return self.order[self.pos - 1]


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _set_rng_state(rng: random.Random, s: list) -> None:
    rng.setstate((s[0], tuple(s[1]), s[2]))


class CurriculumSampler(Sampler):
    """Curriculum over a pool of Examples; see the module docstring for the rule."""

    adaptive = True  # moves on the measured solve rate (update)

    def __init__(self, pool: list[Example], seed: int = 0, config: CurriculumConfig | None = None, *,
                 start_level: Any = None, difficulty: Callable[[Example], Any] = lambda e: e.meta["difficulty"],
                 kind: Callable[[Example], str] = lambda e: str(e.meta.get("type", ""))):
        if not pool:
            raise ValueError("empty pool")
        self.config = config or CurriculumConfig()
        self.seed = seed
        self._difficulty = [difficulty(e) for e in pool]
        self.levels = sorted(set(self._difficulty))
        start = self.levels[0] if start_level is None else start_level
        if start not in self.levels:
            raise ValueError(f"start_level {start!r} is not a level of the pool; levels: {self.levels}")
        self.level_index = self.levels.index(start)
        groups: dict[Any, dict[str, list[int]]] = {lv: {} for lv in self.levels}
        for i, e in enumerate(pool):
            groups[self._difficulty[i]].setdefault(kind(e), []).append(i)
        self.types = {lv: sorted(groups[lv]) for lv in self.levels}
        self._decks = {(lv, t): _Deck(groups[lv][t]) for lv in self.levels for t in self.types[lv]}
        self._type_turn = {lv: 0 for lv in self.levels}
        self.rates: dict[Any, float | None] = {lv: None for lv in self.levels}
        self.results: dict[Any, int] = {lv: 0 for lv in self.levels}
        self.since_move = 0
        self.moves = 0
        self.rng = random.Random(seed)

    @property
    def level(self) -> Any:
        return self.levels[self.level_index]

    def mix(self) -> dict[Any, float]:
        """Share of the next batch per level (sums to 1)."""
        c, i = self.config, self.level_index
        w = {lv: 0.0 for lv in self.levels}
        w[self.level] = 1.0 - c.review_frac - c.lookahead_frac
        if i > 0:
            for lv in self.levels[:i]:
                w[lv] += c.review_frac / i
        else:
            w[self.level] += c.review_frac
        if i + 1 < len(self.levels):
            w[self.levels[i + 1]] += c.lookahead_frac
        else:
            w[self.level] += c.lookahead_frac
        return w

    def next(self, k: int) -> list[int]:
        """``k`` pool indices for the next batch."""
        w = self.mix()
        levels = [lv for lv in self.levels if w[lv] > 0]
        out = []
        for lv in self.rng.choices(levels, weights=[w[lv] for lv in levels], k=k):
            types = self.types[lv]
            t = types[self._type_turn[lv] % len(types)]
            self._type_turn[lv] += 1
            out.append(self._decks[(lv, t)].draw(self.rng))
        return out

    def update(self, indices: list[int], correct: list[float]) -> None:
        """Feed back the results of problems drawn by ``next`` (1.0 solved, 0.0 not; a group of G
        generations may be passed as G results or as their mean); then move if the rule says so."""
        if len(indices) != len(correct):
            raise ValueError(f"got {len(indices)} indices but {len(correct)} results")
        a = self.config.ema
        for i, c in zip(indices, correct):
            lv = self._difficulty[i]
            prev = self.rates[lv]
            self.rates[lv] = float(c) if prev is None else (1 - a) * prev + a * float(c)
            self.results[lv] += 1
            if lv == self.level:
                self.since_move += 1
        rate = self.rates[self.level]
        if self.since_move < self.config.min_results or rate is None:
            return
        if rate > self.config.advance_above and self.level_index + 1 < len(self.levels):
            self._move(+1)
        elif rate < self.config.retreat_below and self.level_index > 0:
            self._move(-1)

    def _move(self, step: int) -> None:
        self.level_index += step
        self.since_move = 0
        self.moves += 1

    def metrics(self, prefix: str = "curriculum/") -> dict[str, float]:
        """Current level, per-level moving solve rates (-1 where none yet) and the batch mix."""
        m = {f"{prefix}level": float(self.level), f"{prefix}level_index": float(self.level_index),
             f"{prefix}moves": float(self.moves), f"{prefix}results_at_level": float(self.since_move)}
        for lv in self.levels:
            r = self.rates[lv]
            m[f"{prefix}solve_rate/{lv}"] = -1.0 if r is None else r
        for lv, w in self.mix().items():
            m[f"{prefix}mix/{lv}"] = w
        return m

    def state(self) -> dict:
        """JSON-serialisable state; ``load_state`` on a sampler built from the same pool resumes it."""
        return {
            "level_index": self.level_index, "since_move": self.since_move, "moves": self.moves,
            "rates": [self.rates[lv] for lv in self.levels], "results": [self.results[lv] for lv in self.levels],
            "type_turn": [self._type_turn[lv] for lv in self.levels],
            "decks": [[d.order, d.pos] for d in self._decks.values()], "rng": _rng_state(self.rng),
        }

    def load_state(self, s: dict) -> None:
        if len(s["rates"]) != len(self.levels) or len(s["decks"]) != len(self._decks):
            raise ValueError("curriculum state does not match this pool (different levels or types)")
        self.level_index, self.since_move, self.moves = s["level_index"], s["since_move"], s["moves"]
        self.rates = dict(zip(self.levels, s["rates"]))
        self.results = dict(zip(self.levels, s["results"]))
        self._type_turn = dict(zip(self.levels, s["type_turn"]))
        for d, (order, pos) in zip(self._decks.values(), s["decks"]):
            d.order, d.pos = list(order), pos
        _set_rng_state(self.rng, s["rng"])


# ---------------------------------------------------------------------------------------------
# mixing tasks


class WeightedSampler(Sampler):
    """Deals pool indices task by task in proportion to weights (smooth weighted round-robin:
    after n draws each task has within one draw of n * its share), each task's examples in seeded
    per-pass permutations."""

    def __init__(self, pool: list[Example], weights: dict[str, float], seed: int = 0,
                 key: Callable[[Example], str] = lambda e: e.meta["task"]):
        groups: dict[str, list[int]] = {}
        for i, e in enumerate(pool):
            groups.setdefault(key(e), []).append(i)
        missing = [t for t in weights if t not in groups]
        if missing:
            raise ValueError(f"weights name tasks with no examples: {missing}; tasks: {sorted(groups)}")
        if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(f"weights must be >= 0 with a positive sum, got {weights}")
        total = sum(weights.values())
        self.weights = {t: weights[t] / total for t in weights if weights[t] > 0}
        self._decks = {t: _Deck(groups[t]) for t in self.weights}
        self._credit = {t: 0.0 for t in self.weights}
        self.drawn = {t: 0 for t in self.weights}
        self.rng = random.Random(seed)

    def next(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            for t, w in self.weights.items():
                self._credit[t] += w
            t = max(self._credit, key=lambda x: self._credit[x])  # first on ties: deterministic
            self._credit[t] -= 1.0
            self.drawn[t] += 1
            out.append(self._decks[t].draw(self.rng))
        return out

    def metrics(self, prefix: str = "mix/") -> dict[str, float]:
        n = max(1, sum(self.drawn.values()))
        m = {f"{prefix}weight/{t}": w for t, w in self.weights.items()}
        m.update({f"{prefix}drawn_frac/{t}": c / n for t, c in self.drawn.items()})
        return m

    def state(self) -> dict:
        return {"credit": self._credit, "drawn": self.drawn,
                "decks": {t: [d.order, d.pos] for t, d in self._decks.items()}, "rng": _rng_state(self.rng)}

    def load_state(self, s: dict) -> None:
        if set(s["credit"]) != set(self.weights):
            raise ValueError(f"mix state is for tasks {sorted(s['credit'])}, this sampler has {sorted(self.weights)}")
        self._credit, self.drawn = dict(s["credit"]), dict(s["drawn"])
        for t, (order, pos) in s["decks"].items():
            self._decks[t].order, self._decks[t].pos = list(order), pos
        _set_rng_state(self.rng, s["rng"])


def _tag(examples: list[Example], task: str) -> list[Example]:
    return [Example(id=f"{task}/{e.id}", prompt=e.prompt, answer=e.answer, meta={**e.meta, "task": task})
            for e in examples]


@dataclass
class MixedTask(Task):
    """Several tasks as one: train, eval and each probe are their union (ids prefixed with the
    task name, ``meta["task"]`` set), the reward is the example's own task's, and a health rule
    any of them skips is skipped. ``weights`` (task -> share)
    only take effect through ``make_sampler``."""

    weights: dict[str, float] = field(default_factory=dict)

    def make_sampler(self, seed: int) -> WeightedSampler:
        return WeightedSampler(self.train, self.weights, seed)


def mix_tasks(tasks: dict[str, Task], weights: dict[str, float] | None = None, name: str = "mixed") -> MixedTask:
    """A MixedTask of ``tasks`` (name -> Task); ``weights`` default to equal shares."""
    if not tasks:
        raise ValueError("no tasks to mix")
    weights = dict(weights) if weights is not None else {t: 1.0 for t in tasks}
    unknown = [t for t in weights if t not in tasks]
    if unknown:
        raise ValueError(f"weights for unknown tasks {unknown}; tasks: {sorted(tasks)}")
    prompts = {t.system_prompt for t in tasks.values()}
    if len(prompts) > 1:
        raise ValueError(f"the tasks have different system prompts ({prompts}); a mixed task has one")
    rewards = {t: task.reward for t, task in tasks.items()}

    def reward(completion: str, example: Example, truncated: bool) -> tuple[float, dict[str, float]]:
        return rewards[example.meta["task"]](completion, example, truncated)

    train = [e for t, task in tasks.items() for e in _tag(task.train, t)]
    held_out = [e for t, task in tasks.items() for e in _tag(task.eval, t)]
    probes: dict[str, list[Example]] = {}
    for t, task in tasks.items():
        for k, v in task.probes.items():
            probes.setdefault(k, []).extend(_tag(v, t))
    skip = tuple(sorted({r for task in tasks.values() for r in task.health_skip}))
    return MixedTask(name=name, train=train, eval=held_out, reward=reward, system_prompt=prompts.pop(),
                     probes=probes, health_skip=skip, weights={t: weights.get(t, 0.0) for t in tasks})


def mixed_task(tasks: dict[str, float], task_args: dict[str, dict] | None = None) -> MixedTask:
    """Registered builder: ``tasks`` maps registered task names to weights, ``task_args`` their
    builders' keyword arguments, e.g. tasks={"arithmetic": 0.7, "code_problems": 0.3}."""
    task_args = task_args or {}
    built = {t: build_task(t, **task_args.get(t, {})) for t in tasks}
    return mix_tasks(built, tasks)
