"""`horizon tune --batch B` (issue 39: "every explicit flag pins its field and the search covers
the rest"): the batch is the user's training hyperparameter, so only its splits into
micro-batches are searched, and the best row, its train line and its job keep B."""
import json

import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.plan.tune import SearchSpace, tune
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.hf_config import load_model


@pytest.mark.parametrize("batch", [4, 6, 16])
def test_every_configuration_searched_has_the_batch(batch):
    res = tune(load_model("tiny"), make_hardware("h100-pcie", "256GiB"), 128, space=SearchSpace(batch=batch),
               workers=1, progress=False)
    assert len(res.table) and set(res.table["batch"]) == {batch}
    assert res.best.batch == batch and res.best.batch == res.best.micro_batch * res.best.micro_batches
    if batch == 16:   # its splits are searched, not just the one micro-batch
        assert len(set(res.table["micro_batches"])) > 1


def test_a_bad_batch_is_refused_by_name():
    with pytest.raises(HorizonError, match="batch=0 must be a positive integer"):
        SearchSpace(batch=0)


def test_the_cli_keeps_the_batch_in_its_train_line(capsys):
    from horizon_sim.cli.main import main
    assert main(["tune", "--model", "tiny", "--gpu", "h100-pcie", "--ram", "256GiB", "--batch", "8", "--seq", "128",
                 "--quiet", "--workers", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"]["batch"] == 8 and "--batch 8" in out["train_command"]
