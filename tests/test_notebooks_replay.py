"""replay.ipynb under papermill (issue 33): on a tiny attempt whose steps were recorded, the notebook replays the
latest recorded step, says FAITHFUL, shows the table of the recorded configuration and its counterfactuals, and
the inspector in a sandboxed iframe (the same page the report links)."""

import nbformat
import pytest

from rftlib.notebooks import NOTEBOOKS
from rftlib.report.publish import execute
from rftlib.train.loop import Trainer
from toy_rewards import isdigit_share


@pytest.fixture(scope="module")
def attempt(tmp_path_factory, task_with):
    from rftlib.config import make_config
    cfg = make_config("tiny", {"runs_root": str(tmp_path_factory.mktemp("replay-nb") / "runs"), "num_steps": 2,
                               "record_batches": [2], "train_batch_size": 2, "lr": 3e-2, "warmup_ratio": 0.0,
                               "autocast": "none"})
    tr = Trainer(cfg, progress=False, task=task_with(cfg, isdigit_share))
    tr.train()
    tr.close()
    return tr.run_dir


def _outputs(nb) -> str:
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            assert o["output_type"] != "error", o
            out.append(str(o.get("data", {}).get("text/html", "")) + str(o.get("text", "")))
    return "\n".join(out)


def test_replay_notebook_under_papermill(attempt, tmp_path):
    nb_path = execute(NOTEBOOKS / "replay.ipynb", tmp_path / "replay.ipynb",
                      {"run_dir": str(attempt), "step": 2, "counterfactuals": [{"policy_loss": "gspo"}]})
    text = _outputs(nbformat.read(str(nb_path), as_version=4))
    assert "FAITHFUL: " in text and "NOT REPRODUCED: " not in text  # the verdict line (the page script names both)
    assert "policy_loss=gspo" in text  # the counterfactual's rows in the table
    assert '<iframe' in text and 'sandbox="allow-scripts"' in text and "srcdoc=" in text
    assert (attempt / "records" / "step_2" / "inspector.html").exists()
