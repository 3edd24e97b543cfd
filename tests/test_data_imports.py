"""rftlib.data imports without a loop: the task types and registry live in rftlib.data.base, which
imports no builder; each builder imports base (never rftlib.data.tasks); the math reward lives with
the rewards. The old names in rftlib.data.tasks still work."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "rftlib" / "data"
BUILDERS = ["arithmetic", "benchmarks", "code_problems", "curriculum", "prepare"]


def _imports(path: Path) -> set[str]:
    """Every rftlib module a file imports, at module level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rftlib"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # from rftlib.data import arithmetic
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("rftlib")}
    return out


def test_no_import_cycle_inside_rftlib_data():
    # before: tasks.py imported every builder (in registered_tasks) and every builder imported tasks.py
    mods = {p.stem: _imports(p) for p in DATA.glob("*.py") if p.stem != "__init__"}
    graph = {m: {d.rsplit(".", 1)[-1] for d in deps if d.startswith("rftlib.data.") and d.rsplit(".", 1)[-1] in mods}
             for m, deps in mods.items()}
    seen: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        if seen.get(m) == 1:
            raise AssertionError(f"import cycle: {' -> '.join(path + [m])}")
        if seen.get(m) == 2:
            return
        seen[m] = 1
        for d in graph[m]:
            visit(d, path + [m])
        seen[m] = 2

    for m in graph:
        visit(m, [])
    assert not any("rftlib.data.tasks" in mods[b] for b in BUILDERS)  # builders import base, not tasks


@pytest.mark.parametrize("mod", ["base", "tasks"] + BUILDERS)
def test_each_module_imports_alone(mod):
    # a fresh interpreter, so nothing was imported first; importing a builder must not pull in the others
    code = (f"import sys, rftlib.data.{mod}; "
            "print(sorted(m for m in sys.modules if m.startswith('rftlib.data.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if mod == "arithmetic":  # the smallest builder: itself, base, and nothing of the other builders
        assert out.stdout.strip() == "['rftlib.data.arithmetic', 'rftlib.data.base']"


def test_math_reward_lives_with_the_rewards_and_old_imports_work():
    from rftlib.data.tasks import build_task, math_em_reward, registered_tasks
    from rftlib.rewards import math_em_reward as reward

    assert math_em_reward is reward and reward.__module__ == "rftlib.rewards.math"
    assert {"arithmetic", "gsm8k", "prepared", "code_problems", "mixed"} <= set(registered_tasks().names())
    assert build_task("arithmetic", eval_size=10).reward is math_em_reward
