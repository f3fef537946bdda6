"""Issue 30, 3: batches with no target token (every label ignored, e.g. instruction data whose
prompts are longer than --seq) are no silent loss 0: each step's JSON line holds its
labelled_tokens, such steps get a warning and are counted in the summary, an eval without a
target reports none (null), and a run whose every batch was empty exits 1."""
import dataclasses
import json

import pytest
import torch

from horizon_exec.data import data as data_mod
from horizon_sim.cli.main import main
from tests.train_run import TINY

pytestmark = pytest.mark.usefixtures("one_intraop_thread")
FAST = ["--compute-dtype", "fp32", "--no-working-copy"]


def _targets_only(monkeypatch, keep):
    """load_dataset whose stream keeps a target only in the sequences i with keep(i) (stream
    position p is the target of sequence (p - 1) // seq)."""
    real = data_mod.load_dataset

    def load(*a, **kw):
        ds = real(*a, **kw)
        st = ds.data.stream
        seq_of = (torch.arange(st.ids.numel()) - 1).clamp(min=0) // ds.data.seq
        target = torch.tensor([bool(keep(int(i))) for i in range(int(seq_of.max()) + 1)])[seq_of]
        ds.data.stream = dataclasses.replace(st, target=target)
        return ds
    monkeypatch.setattr(data_mod, "load_dataset", load)


def _log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_whose_every_batch_has_no_target_fails(tmp_path, monkeypatch, capsys):
    _targets_only(monkeypatch, lambda i: False)
    log = tmp_path / "log.jsonl"
    assert main(["train", *TINY, *FAST, "--steps", "2", "--eval-batches", "1", "--log-file", str(log)]) == 1
    out, err = capsys.readouterr()
    assert "warning: step 1: the batch has no target token" in out
    assert "2 of 2 step(s) had a batch with no target token (loss 0, nothing trained): 1, 2" in out
    assert "step 2: eval: no target token in the 1 held-out batches, no eval loss" in out
    assert "eval loss" not in out.split("final loss")[1]
    assert err.startswith("horizon train: error: no batch of this run (2 step(s)) had a target token") and \
        "--seq 32" in err and len(err.strip().splitlines()) == 1
    recs = _log(log)
    assert [r["labelled_tokens"] for r in recs if "loss" in r] == [0, 0]
    assert recs[-1] == {"step": 2, "eval_loss": None}


def test_some_empty_batches_are_counted_and_the_run_succeeds(tmp_path, monkeypatch, capsys):
    _targets_only(monkeypatch, lambda i: i % 2)
    log = tmp_path / "log.jsonl"
    assert main(["train", *TINY, *FAST, "--batch", "1", "--steps", "6", "--log-file", str(log)]) == 0
    out = capsys.readouterr().out
    empty = [r["step"] for r in _log(log) if r["labelled_tokens"] == 0]
    assert 0 < len(empty) < 6   # this seed draws both kinds
    assert f"{len(empty)} of 6 step(s) had a batch with no target token (loss 0, nothing trained): " \
           f"{', '.join(map(str, empty))}" in out
    assert out.count("warning:") == 1 and f"warning: step {empty[0]}: the batch has no target token" in out
