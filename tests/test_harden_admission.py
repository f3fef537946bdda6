"""Issue 19 item 6: the admission is an upper bound of what a run holds.

- The training data is counted before it is loaded (data.data_bytes_bound, from the file's
  size) and loaded streaming, so a large file is refused before it is read and a run never
  holds more of it than was admitted.
- Eval (Trainer.eval_loss, between steps) is counted: its temporaries are bounded by
  work.eval_temp_peak_bytes, checked against the executor's measured temporaries.
- Over a grid of `horizon train` runs, each in its own process, the peak resident set
  (VmHWM) never exceeds the host RAM the admission said the run needs.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from horizon_exec.files.data import BUILTIN_CORPUS, data_bytes_bound
from horizon_exec.device.memtrack import TransientTracker
from horizon_exec.files.tokenize import ByteTokenizer
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.cli.main import main
from horizon_sim.schedule import work
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_intraop_thread")


class _Arena:  # the tracker's arena interface, counting nothing
    ptrs: set = set()

    def transient(self, n, what=""):
        pass


@pytest.mark.parametrize("L, H, F, V, B, T, mb, chunk, dtype, tied, win, docs", [
    (2, 512, 1376, 8192, 4, 256, 2, 256, "bf16", False, 0, False),   # a real LM head, 2 micro-batches
    (2, 256, 688, 32000, 4, 128, 1, 1024, "bf16", True, 0, False),   # large tied vocabulary: the head dominates
    (2, 256, 688, 256, 8, 256, 8, 1024, "bf16", False, 0, False),    # byte vocabulary: a layer dominates
    (2, 128, 352, 2048, 2, 64, 2, 32, "fp32", False, 0, False),      # fp32: the head is a view, not a copy
    (2, 128, 352, 256, 2, 256, 1, 1024, "bf16", False, 32, True),    # windows and document masks
])
def test_eval_temporaries_stay_under_their_bound(L, H, F, V, B, T, mb, chunk, dtype, tied, win, docs):
    spec = ModelSpec(n_layers=L, hidden=H, n_heads=H // 64, n_kv_heads=max(1, H // 128), ffn_hidden=F,
                     vocab=V, tied_embeddings=tied, layer_windows=(win,) * L if win else ())
    kw = dict(compute_dtype="fp32", grad_dtype="fp32", working_copy=False) if dtype == "fp32" else {}
    pol = Policy(batch=B, seq=T, micro_batches=B // mb, loss_chunk_tokens=chunk, doc_masks=docs, **kw)
    a = 4 if dtype == "fp32" else 2
    with Trainer(spec, pol, admission=False) as tr:
        toks = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
        tr.step(toks)
        t = TransientTracker(_Arena(), "eval")
        with t:
            tr.eval_loss(toks)
    mask = work.mask_bytes(mb, T, docs) if (win or docs) else 0
    bound = work.eval_temp_peak_bytes(spec, B, mb, T, chunk, a, head_copy=dtype != "fp32", mask=mask, doc_masks=docs)
    assert t.peak <= bound <= 2 * t.peak, (t.peak, bound)  # an upper bound, and not a loose one


def test_data_is_counted_before_it_is_read(tmp_path, monkeypatch, capsys):
    """A data file whose tokens do not fit the host budget is refused by the admission, with
    the data named in the breakdown, before a byte of it is read."""
    big = tmp_path / "big.txt"
    with open(big, "w") as f:
        f.truncate(4 * 2**30)       # 4 GiB of holes: its size is all the admission looks at
    import horizon_exec.files.data as data

    def never(*a, **k):
        raise AssertionError("the data was loaded before the admission refused it")
    monkeypatch.setattr(data, "load_dataset", never)
    rc = main(["train", "--model", "tiny", "--steps", "1", "--batch", "2", "--seq", "64", "--data", str(big),
               "--host-budget", "4GiB"])
    err = capsys.readouterr().err
    assert rc == 2 and "does not fit in host RAM" in err and "training data" in err, err


def test_loading_holds_what_the_bound_says(tmp_path):
    """A 24 MB text file loads streaming, in its own process: the peak grows by about the
    tokens (2 bytes each with byte ids), within data_bytes_bound, not by ~20x the file."""
    text = BUILTIN_CORPUS.read_text()
    f = tmp_path / "d.txt"
    f.write_text(text * (24_000_000 // len(text)))
    code = ("import sys, json\nfrom horizon_exec.measure.probe import vm_hwm_bytes\n"
            "from horizon_exec.files.data import load_dataset\nfrom horizon_exec.files.tokenize import ByteTokenizer\n"
            "before = vm_hwm_bytes()\nds = load_dataset(sys.argv[1], ByteTokenizer(), 256)\n"
            "print(json.dumps([before, vm_hwm_bytes(), ds.n_tokens]))")
    out = subprocess.run([sys.executable, "-c", code, str(f)], cwd=ROOT, capture_output=True, text=True, check=True)
    before, after, n = json.loads(out.stdout)
    assert n > 23_000_000
    assert after - before <= data_bytes_bound(f, ByteTokenizer(), 256), (after - before)
    assert after - before <= 4 * n  # ids (2 B) and the rest; the list-of-tensors loader took ~20 B a token


_RUN = """
import json, sys
import horizon_exec.train.admission as adm_mod
from horizon_exec.measure.probe import vm_hwm_bytes
from horizon_sim.cli.main import main
seen = []
real = adm_mod.admit
def spy(*a, **k):
    r = real(*a, **k)
    seen.append(r.host_need_bytes)
    return r
import horizon_exec.runtime.trainer as trainer_mod
trainer_mod.admit = spy
rc = main(sys.argv[1:])
print(json.dumps([rc, seen[0], vm_hwm_bytes()]))
"""


@pytest.mark.parametrize("argv", [
    ["--model", "tiny", "--batch", "4", "--seq", "128", "--eval-batches", "4", "--eval-every", "1"],
    ["--batch", "4", "--seq", "256", "--eval-batches", "8", "--eval-every", "1", "--optimizer", "after"],
    ["--model", "tiny", "--batch", "2", "--seq", "256", "--data", "BIG", "--eval-batches", "2"],
    ["--model", "tiny", "--batch", "4", "--seq", "128", "--doc-masks", "--micro-batches", "2"],
])
def test_measured_peak_never_exceeds_the_admitted_need(tmp_path, argv):
    """Each run in its own process (its own VmHWM): the eval-heavy wide configuration of the
    issue (width 512, an 8k vocabulary, 8 eval batches after every step), a 30 MB data file,
    document masks."""
    cfg = tmp_path / "wide.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512,
                               "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 1376,
                               "vocab_size": 8192}))
    if "--model" not in argv:
        argv = ["--model", str(cfg), *argv]
    if "BIG" in argv:
        text = BUILTIN_CORPUS.read_text()
        (tmp_path / "big.txt").write_text(text * (30_000_000 // len(text)))
        argv = [str(tmp_path / "big.txt") if a == "BIG" else a for a in argv]
    out = subprocess.run([sys.executable, "-c", _RUN, "train", "--steps", "2", "--no-progress", *argv],
                         cwd=ROOT, capture_output=True, text=True)
    rc, admitted, peak = json.loads(out.stdout.strip().splitlines()[-1])
    assert rc == 0, out.stderr
    assert peak <= admitted, f"peak {peak / 2**20:.0f} MiB > admitted {admitted / 2**20:.0f} MiB"
