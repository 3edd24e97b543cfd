"""File modes of what a run writes: torch-free, so the attempts layer and the records writer share it."""

from __future__ import annotations

import os
from pathlib import Path


def chmod_as_umask(path: str | Path) -> None:
    """Give a file the mode an ordinary ``open`` would (0666 less the umask): files made through
    ``tempfile.mkstemp`` (0600) or by a library that restricts them would otherwise keep others out, and links
    to them on a shared reports directory break for every reader but the writer."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)
