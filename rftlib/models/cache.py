"""Where rftlib keeps models it builds or converts (the embedded default, the tiny test models, GGUF
copies): ``<repo>/.cache``, or ``RFTLIB_CACHE``. A module of its own so that loading.py and the
test-model builders (tiny.py, gptoss.py) can both use it without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Where set-up puts the embedded model and converted copies (RFTLIB_CACHE overrides)."""
    return Path(os.environ.get("RFTLIB_CACHE", REPO_ROOT / ".cache"))
