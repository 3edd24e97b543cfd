"""scripts/import_graph.py holds the line on rftlib's package graph: no import points up the declared
layers, no circles."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
ig = importlib.util.module_from_spec(_spec)
sys.modules["import_graph"] = ig  # its dataclass looks its module up there
_spec.loader.exec_module(ig)


def test_no_import_points_up_the_layers_and_nothing_is_circular():
    g = ig.analyse(ROOT)
    assert not g.unknown, f"packages in no layer of scripts/import_graph.py LAYERS: {g.unknown}"
    assert not g.up, {e: g.edges[e] for e in g.up}
    assert not g.package_circles, g.package_circles
    assert not g.module_circles, g.module_circles


def test_the_graph_flags_an_upward_import_hidden_in_a_function_and_the_circle_it_makes(tmp_path):
    shutil.copytree(ROOT / "rftlib", tmp_path / "rftlib")
    (tmp_path / "rftlib" / "algo" / "bad.py").write_text("def f():\n    from rftlib.train.loop import Trainer\n")
    g = ig.analyse(tmp_path)
    assert ("algo", "train") in g.up and g.edges[("algo", "train")] == ["rftlib/algo/bad.py:2 fn"]
    assert any({"algo", "train"} <= set(c) for c in g.package_circles)  # train imports algo: a circle
    assert ig.main(["--root", str(tmp_path)]) == 1
