"""Library chatter out of the cell output: transformers' / torch's warnings and the weight-loading
progress bars go to a log file (``logs/library_warnings.log``) while a notebook shows its live panel."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
from transformers.utils import logging as tlog


@contextlib.contextmanager
def quiet_libraries(log_path: Path):
    """Keep transformers' / torch's warnings and weight-loading progress bars out of the cell output
    (they would sit in the middle of the live panel) and record them in ``log_path`` instead."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_path)
    restore = []
    restore.append((tlog.set_verbosity, tlog.get_verbosity()))
    tlog.set_verbosity_warning()
    tlog.disable_default_handler()
    tlog.add_handler(handler)
    restore.append((lambda _: (tlog.remove_handler(handler), tlog.enable_default_handler()), None))
    if tlog.is_progress_bar_enabled():
        tlog.disable_progress_bar()
        restore.append((lambda _: tlog.enable_progress_bar(), None))
    if not are_progress_bars_disabled():
        disable_progress_bars()
        restore.append((lambda _: enable_progress_bars(), None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            yield
        finally:
            with open(log_path, "a") as f:
                for w in caught:
                    f.write(f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})\n")
            for fn, arg in reversed(restore):
                fn(arg)
            handler.close()
