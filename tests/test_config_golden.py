"""Every preset resolves to the same config as before the registries and the CLI were made light.

tests/data/presets_golden.json was written from main at cd6017e, before any of that change, as
``{preset: to_dict(make_config(preset))}`` for every params/*.yaml plus ``<defaults>`` (make_config()), json
with sorted keys. A change that moves a default, a derived value (train_batch_size, num_steps, task_args)
or a field's name shows here as the preset and the keys that differ. Regenerate it only for a change that
means to move a resolved value, and say so in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rftlib.config import PARAMS_DIR, make_config, to_dict

GOLDEN = json.loads((Path(__file__).parent / "data" / "presets_golden.json").read_text())


def test_the_golden_file_covers_every_preset():
    assert set(GOLDEN) == {p.stem for p in PARAMS_DIR.glob("*.yaml")} | {"<defaults>"}


@pytest.mark.parametrize("preset", sorted(GOLDEN))
def test_a_preset_resolves_to_its_golden_config(preset):
    cfg = make_config(None if preset == "<defaults>" else preset)
    got = json.loads(json.dumps(to_dict(cfg), sort_keys=True))  # as written: tuples become lists
    want = GOLDEN[preset]
    assert got == want, {k: (want.get(k), got.get(k)) for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k)}
