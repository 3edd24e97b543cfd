"""scripts/import_graph.py holds the line on rftlib's package graph: no import points up the declared
layers, no circles; and on where imports sit: at the top of files, except the optional packages, each
imported in its one module (OPTIONAL), and the reasoned EXCEPTIONS."""

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


def test_backends_are_a_layer_of_their_own_below_config_and_train_with_no_exception():
    """rftlib/backends/ is a package on layer 2 (the config reads BACKENDS from above): the graph knows no
    seam or other exception, so a backend importing the trainer is an upward edge like any other."""
    assert not hasattr(ig, "SEAMS")
    layer = {name: i for i, names in enumerate(ig.LAYERS) for name in names}
    assert layer["backends"] < layer["config"] < layer["train"]
    assert ig.node_of("rftlib.backends.deepspeed") == "backends"
    assert ig.node_of("rftlib.train.loop") == "train"


def test_the_graph_flags_a_backend_that_imports_the_trainer(tmp_path):
    shutil.copytree(ROOT / "rftlib", tmp_path / "rftlib")
    (tmp_path / "rftlib" / "backends" / "bad.py").write_text("from rftlib.train.step_metrics import step_metrics\n")
    g = ig.analyse(tmp_path)
    assert g.edges[("backends", "train")] == ["rftlib/backends/bad.py:1"]
    assert ("backends", "train") in g.up
    assert ig.main(["--root", str(tmp_path)]) == 1


def test_imports_are_at_the_top_of_files_except_optional_packages_each_in_one_module():
    rule = ig.import_rule(ROOT)
    assert not rule.unknown, [f"{i.where} {i.module}" for i in rule.unknown]
    assert not rule.violations, "imports inside functions (move them to the top of the file):\n" + "\n".join(
        f"{i.where} {i.module} [{i.kind}]" for i in rule.violations)
    assert not rule.elsewhere, "optional packages imported outside their one module (scripts/import_graph.py OPTIONAL):\n" + "\n".join(
        f"{i.where} {i.module} (its module: {ig.OPTIONAL[i.top]})" for i in rule.elsewhere)
    for pkg, home in ig.OPTIONAL.items():  # the allow-list names modules that exist
        assert (ROOT / home).exists(), (pkg, home)
    for (path, _pkg) in ig.EXCEPTIONS:
        assert (ROOT / path).exists(), path


def test_the_rule_flags_an_own_import_in_a_function_and_an_optional_package_outside_its_module(tmp_path):
    shutil.copytree(ROOT / "rftlib", tmp_path / "rftlib")
    (tmp_path / "rftlib" / "algo" / "bad.py").write_text(
        "import os\n\n\ndef f():\n    from rftlib.config import RunConfig\n    import json\n    import vllm\n\n"
        "def g():\n    import some_unheard_of_package\n")
    rule = ig.import_rule(tmp_path)
    flagged = {(i.where, i.module, i.kind) for i in rule.violations}
    assert ("rftlib/algo/bad.py:5", "rftlib.config", "own") in flagged
    assert ("rftlib/algo/bad.py:6", "json", "stdlib") in flagged
    assert not any(i.where == "rftlib/algo/bad.py:1" for i in rule.violations)  # a top-level import is fine
    assert [i.where for i in rule.elsewhere if i.where.startswith("rftlib/algo/")] == ["rftlib/algo/bad.py:7"]
    assert [i.module for i in rule.unknown if i.where.startswith("rftlib/algo/")] == ["some_unheard_of_package"]
    assert ig.main(["--root", str(tmp_path)]) == 1
