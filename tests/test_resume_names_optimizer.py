"""A resume refused for another policy names the choice the user changed, not a field that
choice implies: --optimizer backward turns grad_clip off (Policy.from_choices), and the
refusal must name the optimizer (issue 43, item 8g)."""
import pytest

from horizon_exec.checkpoints.ckpt import check_compatible
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def _meta(policy: Policy, model) -> dict:
    return {"model": model.to_dict(), "policy": policy.to_dict()}


def test_another_optimizer_is_named_not_the_grad_clip_it_implies(tmp_path):
    model = model_preset("tiny")
    written = Policy.from_choices(batch=1, seq=16, optimizer="pipelined")   # what the CLI builds
    with Trainer(model, Policy.from_choices(batch=1, seq=16, optimizer="backward")) as tr:
        with pytest.raises(HorizonError) as e:
            check_compatible(tmp_path, _meta(written, model), tr)
    msg = str(e.value)
    assert "\n" not in msg
    assert "policy optimizer='pipelined', this run has optimizer='backward'" in msg, msg
    assert "grad_clip differs too" in msg, msg   # the implied field is still said, second


def test_a_grad_clip_alone_is_still_named(tmp_path):
    model = model_preset("tiny")
    with Trainer(model, Policy.from_choices(batch=1, seq=16, grad_clip=0.5)) as tr:
        with pytest.raises(HorizonError, match=r"policy grad_clip=1.0, this run has grad_clip=0.5; resume with "
                                               r"the same policy$"):
            check_compatible(tmp_path, _meta(Policy.from_choices(batch=1, seq=16), model), tr)
