"""Declare light, build heavy: resolving a config imports no torch, transformers, peft or papermill.

The config checks every registry name and every declared rule (a loss's clip fields and aggregations, an
engine's and a backend's config rules) through torch-free declarations; the tensor code, the engines and the
backends are imported only when something is built. Each check runs in a fresh interpreter: this test
process has imported torch long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "peft", "papermill", "deepspeed", "vllm")


def heavy_modules_after(code: str) -> list[str]:
    """The HEAVY top-level packages in sys.modules after ``code`` ran in a fresh interpreter."""
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_import_rftlib_config_loads_no_heavy_package():
    assert heavy_modules_after("import rftlib.config") == []


def test_resolving_every_preset_and_checking_every_registry_loads_no_heavy_package():
    code = ("from rftlib.config import PARAMS_DIR, make_config\n"
            "for p in sorted(PARAMS_DIR.glob('*.yaml')): make_config(p.stem)\n"
            # the declared rules refuse as before: a loss's aggregation, a backend's and an engine's own checks
            "from rftlib.config import ConfigError\n"
            "for bad in ({'policy_loss': 'gspo', 'loss_agg_mode': 'token-mean'}, {'offload_optimizer': True},\n"
            "            {'backend': 'deepspeed', 'zero_stage': 1}, {'eval_n_samples': {'heldout': 4}}):\n"
            "    try:\n"
            "        make_config('tiny', bad)\n"
            "    except ConfigError:\n"
            "        pass\n"
            "    else:\n"
            "        raise SystemExit(f'{bad} was accepted')\n")
    assert heavy_modules_after(code) == []


def test_a_declared_name_is_imported_on_first_lookup_only():
    """The registries list and describe their built-in names without importing them; get() imports the one asked."""
    code = ("from rftlib.algo.loss_spec import POLICY_LOSSES, loss_spec\n"
            "from rftlib.rollout.kinds import ENGINES, engine_kind\n"
            "from rftlib.backends import BACKENDS\n"
            "assert POLICY_LOSSES.names() == ['cispo', 'gmpo', 'gspo', 'ppo_clip']\n"
            "assert loss_spec('gspo').settings().clip_range() == (3e-4, 4e-4)\n"
            "assert engine_kind('hf').on_trainer_module and not engine_kind('vllm').on_trainer_module\n"
            "assert BACKENDS.names() == ['ddp', 'deepspeed', 'single']\n"
            "import sys\n"
            "assert 'torch' not in sys.modules\n"
            "spec = POLICY_LOSSES.get('gspo')\n"
            "assert 'torch' in sys.modules and spec.fn.__module__ == 'rftlib.algo.losses'\n")
    assert "torch" in heavy_modules_after(code)
