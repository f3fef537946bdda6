"""What GPT-2 adds beyond tests/test_families.py's generic checks: learned positions restart at
each document under document masks (a packed sequence's second document is embedded as it is
alone), a step longer than the positions is refused before anything is built (and --seq left
at its default is the positions, in every command), the attention scalings transformers' GPT-2
can switch to are refused by name, and a config's dropout is named rather than silently not
run."""
from dataclasses import replace

import pytest
import torch

from horizon_exec.cli.run_inputs import _dropout_fields
from horizon_sim.errors import HorizonError
from horizon_sim.specs.hf_config import spec_from_config_dict
from horizon_sim.specs.hf_export import to_hf_config_dict
from horizon_sim.specs.policy import Policy
from tests.test_families import B, T, V, tiny

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


def test_positions_restart_at_each_document():
    from horizon_exec.runtime.trainer import Trainer
    spec = tiny("gpt2")
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    with Trainer(spec, Policy(batch=B, seq=T, doc_masks=True, compute_dtype="fp32", grad_dtype="fp32",
                              working_copy=False)) as tr:
        split = torch.zeros(B, T, dtype=torch.int64)
        split[:, T // 2:] = 1
        second = tr.logits(tokens, split)[:, T // 2:]
        alone = tr.logits(tokens[:, T // 2:].repeat(1, 2))[:, :T // 2]
        shifted = tr.logits(tokens)[:, T // 2:]  # one document: the second half at positions T/2..
        tr.step(tokens, docs=split)  # the step's embedding gathers the same positions (it runs)
    assert torch.allclose(second, alone, atol=1e-5)
    assert not torch.allclose(second, shifted, atol=1e-3)


def test_a_step_longer_than_the_learned_positions_is_refused():
    from horizon_sim.schedule import build_schedule
    spec = replace(tiny("gpt2"), max_position=32)
    with pytest.raises(HorizonError, match=r"policy seq=64 is beyond the 32 learned positions of model "
                                           r"'tiny-gpt2' .*; allowed: seq 1\.\.32"):
        build_schedule(spec, Policy(batch=1, seq=64))


@pytest.mark.parametrize("field,value", [("scale_attn_weights", False), ("scale_attn_by_inverse_layer_idx", True)])
def test_attention_scalings_it_does_not_run_are_refused_by_name(field, value):
    d = to_hf_config_dict(tiny("gpt2")) | {field: value}
    with pytest.raises(HorizonError, match=f"{field} = {str(value).lower()} is not supported"):
        spec_from_config_dict(d)


def test_a_configs_dropout_is_named():
    cfg = {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.0, "classifier_dropout": 0.1,
           "attention_dropout": 0.05, "hidden_dropout": True}
    assert _dropout_fields(cfg) == [("attention_dropout", 0.05), ("embd_pdrop", 0.1), ("resid_pdrop", 0.1)]


def test_the_default_seq_is_the_learned_positions_and_a_given_one_is_kept(capsys):
    """plan, tune, min-ram and simulate take --seq's default (2048) down to GPT-2's 1024 and say
    so; a --seq given is the user's (refused past the positions); a RoPE model keeps 2048."""
    import json

    from horizon_sim.cli.main import main
    where = ["--gpu", "h100-pcie", "--ram", "128GiB"]
    assert main(["plan", "--model", "gpt2-124m", *where, "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["policy"]["seq"] == 1024
    assert "seq 1024: gpt2-124m's learned positions (--seq not given; the default 2048 is beyond them)" in out.err
    for cmd in (["tune", *where, "--quiet"], ["min-ram", "--gpu", "h100-pcie"], ["simulate", *where]):
        assert main([cmd[0], "--model", "gpt2-124m", *cmd[1:]]) == 0, cmd
        assert "seq 1024: gpt2-124m's learned positions" in capsys.readouterr().err, cmd
    assert main(["plan", "--model", "gpt2-124m", *where, "--seq", "2048"]) == 2
    assert "beyond the 1024 learned positions" in capsys.readouterr().err
    assert main(["plan", "--model", "tiny", *where, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["seq"] == 2048


def test_train_without_seq_trains_the_learned_positions(tmp_path, capsys):
    import json

    from horizon_sim.cli.main import main
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(to_hf_config_dict(replace(tiny("gpt2"), max_position=48, vocab=256))))
    assert main(["train", "--model", str(cfg), "--device", "cpu", "--steps", "1", "--batch", "2",
                 "--eval-batches", "0", "--no-progress", "--no-search", "--compute-dtype", "fp32"]) == 0
    out = capsys.readouterr()
    assert "seq 48: tiny-gpt2's learned positions (--seq not given" in out.err
    assert "sequences of 48" in out.out
