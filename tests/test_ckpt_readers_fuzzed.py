"""Issue 19, item 12 (checkpoint metadata): the training-checkpoint readers fuzzed. Whatever
trainer.json, SHA256SUMS or the state file's header hold (damaged bytes, odd JSON, a valid
file with one field replaced or removed; checksums rewritten to match so the parser itself is
reached), a resume either loads or raises a one-line HorizonError naming the checkpoint; a
damaged file (CheckpointError) makes a resume from the ckpt_dir fall back to the previous
checkpoint with a warning naming the file. Never another exception.

HORIZON_FUZZ_EXAMPLES raises the examples per reader (default 60; benchmarks/fuzz_ckpt.py runs
thousands)."""
import hashlib
import json
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from horizon_exec.checkpoints import ckpt as ckpt_mod
from horizon_exec.checkpoints.ckpt import CheckpointError
from horizon_exec.data.data import load_dataset
from horizon_exec.train.loop import LoopConfig, TrainLoop
from horizon_exec.optim.lr import CosineSchedule
from horizon_exec.data.tokenize import ByteTokenizer
from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
from horizon_exec.runtime.trainer import Trainer
from horizon_sim.errors import HorizonError
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

SPEC = ModelSpec(n_layers=1, hidden=32, n_heads=2, n_kv_heads=2, ffn_hidden=64, vocab=256)
POL = Policy(batch=1, seq=16, optimizer="pipelined")
EXAMPLES = int(os.environ.get("HORIZON_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 100,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

pytestmark = pytest.mark.usefixtures("one_intraop_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A ckpt_dir with checkpoints after steps 1 and 2, the pristine bytes of every file, and a
    loop (with its trainer) to resume into."""
    root = tmp_path_factory.mktemp("fuzz") / "ck"
    ds = load_dataset(None, ByteTokenizer(), seq=16, eval_fraction=0.01)
    tr = Trainer(SPEC, POL, TrainerConfig(admission=AdmissionConfig(enabled=False)))
    cfg = LoopConfig(steps=4, lr_schedule=CosineSchedule(peak=1e-3, total_steps=4), eval_batches=0,
                     ckpt_dir=str(root), save_every=1, keep_ckpts=0, progress=False)
    loop = TrainLoop(tr, ds, cfg, out=lambda *_: None)
    loop.run(until=2)
    pristine = _Files({p: p.read_bytes() for p in root.rglob("*") if p.is_file()})
    yield root, loop, pristine
    loop.close()
    tr.close()


class _Files(dict):
    def __repr__(self):  # hypothesis prints the fixture of a failing example: not megabytes of it
        return f"<{len(self)} pristine files>"


def _restore(pristine):
    for p, data in pristine.items():
        p.write_bytes(data)


def _write(folder, name: str, data: bytes, fix_sums: bool = True):
    (folder / name).write_bytes(data)
    if fix_sums:  # the damage passes the checksums: the parser itself is what is tested
        sums = {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in ("state.safetensors", "trainer.json")}
        (folder / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sums.items()))


def _resume_is_clean(root, loop, damaged_file):
    """The oracle: resuming from the ckpt_dir loads (the damaged step, or the previous one after a
    warning naming the damaged file) or refuses in one line naming the checkpoint."""
    warnings = []
    loop.out = warnings.append
    try:
        p = loop.resume(root)
    except CheckpointError as e:
        raise AssertionError(f"the intact step 1 was not used: {e}") from e
    except HorizonError as e:
        msg = str(e)
        assert "\n" not in msg and str(root / "step-00000002") in msg, msg
        return "refused"
    finally:
        loop.out = lambda *_: None
    if p.name == "step-00000001":  # the warning names the damaged file (or, for wrong sums, the one they miss)
        assert any(str(damaged_file.parent) in w and w.startswith("warning: skipping checkpoint step-00000002: ")
                   for w in warnings), warnings
        return "fell back"
    assert p.name == "step-00000002"
    return "loaded"


def _folder_is_clean(folder, loop):
    """Loading the damaged folder itself: loads, or one line naming it."""
    try:
        ckpt_mod.load_checkpoint(folder, loop.tr, check=None, warn=lambda *_: None)
    except HorizonError as e:
        assert "\n" not in str(e) and str(folder) in str(e), str(e)
    ckpt_mod.load_checkpoint(folder.parent / "step-00000001", loop.tr)   # a consistent trainer for the next example


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def _paths(obj, prefix=()):
    """Every key path of a JSON object (to replace or delete one)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


def _mutate(meta: dict, path, value, delete: bool) -> dict:
    meta = json.loads(json.dumps(meta))
    node = meta
    for k in path[:-1]:
        node = node[k]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return meta


@FUZZ
@given(data=st.data())
def test_trainer_json_one_field_replaced_or_removed(run, data):
    root, loop, pristine = run
    folder = root / "step-00000002"
    meta = json.loads(pristine[folder / "trainer.json"])
    path = data.draw(st.sampled_from(sorted(_paths(meta))), label="path")
    delete = data.draw(st.booleans(), label="delete")
    value = None if delete else data.draw(json_values, label="value")
    try:
        _write(folder, "trainer.json", json.dumps(_mutate(meta, path, value, delete)).encode())
        _resume_is_clean(root, loop, folder / "trainer.json")
        _folder_is_clean(folder, loop)
    finally:
        _restore(pristine)


@FUZZ
@given(raw=st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode()),
                     st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)))
def test_trainer_json_replaced_whole(run, raw):
    root, loop, pristine = run
    folder = root / "step-00000002"
    try:
        _write(folder, "trainer.json", raw)
        outcome = _resume_is_clean(root, loop, folder / "trainer.json")
        assert outcome in ("fell back", "refused") or raw == pristine[folder / "trainer.json"]
        _folder_is_clean(folder, loop)
    finally:
        _restore(pristine)


@FUZZ
@given(text=st.one_of(st.text(max_size=300), st.lists(st.tuples(
    st.text("0123456789abcdef", min_size=64, max_size=64),
    st.sampled_from(["state.safetensors", "trainer.json", "../../etc/passwd", "/etc/passwd", ".", "..",
                     "a\x00b", "x" * 300, "trainer.json\r"])), max_size=4).map(
        lambda rows: "".join(f"{h}  {n}\n" for h, n in rows))))
def test_sha256sums_damaged(run, text):
    root, loop, pristine = run
    folder = root / "step-00000002"
    try:
        (folder / "SHA256SUMS").write_bytes(text.encode("utf-8", "surrogatepass"))
        assert _resume_is_clean(root, loop, folder / "SHA256SUMS") == "fell back"
        _folder_is_clean(folder, loop)
    finally:
        _restore(pristine)


@FUZZ
@given(data=st.data())
def test_state_header_damaged(run, data):
    root, loop, pristine = run
    folder = root / "step-00000002"
    raw = pristine[folder / "state.safetensors"]
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    kind = data.draw(st.sampled_from(["entry field", "whole header", "length prefix"]), label="kind")
    if kind == "entry field":
        name = data.draw(st.sampled_from(sorted(header)), label="tensor")
        fields = sorted(header[name]) if isinstance(header[name], dict) else []
        if fields and data.draw(st.booleans(), label="one field"):
            header[name][data.draw(st.sampled_from(fields), label="field")] = data.draw(json_values, label="value")
        else:
            header[name] = data.draw(json_values, label="entry")
        hb = json.dumps(header).encode()
        new = struct.pack("<Q", len(hb)) + hb + body
    elif kind == "whole header":
        hb = data.draw(st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())),
                       label="header")
        new = struct.pack("<Q", len(hb)) + hb + body
    else:
        new = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1), label="length")) + raw[8:]
    try:
        _write(folder, "state.safetensors", new)
        # 'loaded': a change the reader may ignore (its __metadata__), checksums rewritten to match
        assert _resume_is_clean(root, loop, folder / "state.safetensors") in ("fell back", "loaded")
        _folder_is_clean(folder, loop)
    finally:
        _restore(pristine)
