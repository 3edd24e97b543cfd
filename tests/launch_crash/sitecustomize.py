"""Test harness for tests/test_launch_detached.py: a planted crash of one trainer rank.

Put this directory on PYTHONPATH and set RFT_TEST_CRASH_RANK=R and RFT_TEST_CRASH_STEP=S: in the
process whose RANK is R, rftlib.train.loop.Trainer.step raises before step S runs. Every Python
process imports sitecustomize at start-up; only the matching rank does anything. Nothing in
rftlib knows about it (the trainer code is not touched).
"""

import os
import sys

if os.environ.get("RFT_TEST_CRASH_STEP") and os.environ.get("RANK") == os.environ.get("RFT_TEST_CRASH_RANK", "1"):
    import importlib.abc
    import importlib.util

    _STEP = int(os.environ["RFT_TEST_CRASH_STEP"])

    def _plant(module):
        step = module.Trainer.step

        def crashing_step(self, *a, **k):
            if self.step_num + 1 == _STEP:
                raise RuntimeError(f"planted crash: rank {os.environ['RANK']} at step {_STEP} (RFT_TEST_CRASH_STEP)")
            return step(self, *a, **k)

        module.Trainer.step = crashing_step

    class _Finder(importlib.abc.MetaPathFinder):
        """Wraps rftlib.train.loop's loader so the Trainer is patched right after the module runs."""

        def find_spec(self, name, path, target=None):
            if name != "rftlib.train.loop":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_plant(module):
                exec_module(module)
                _plant(module)

            spec.loader.exec_module = exec_and_plant
            return spec

    sys.meta_path.insert(0, _Finder())
