"""Schedule <-> JSON: a lossless round trip, and tampered files rejected with ScheduleError."""
import json

import pytest

from horizon_sim.schedule import OpKind, ScheduleError, build_schedule
from horizon_sim.schedule.serialize import FORMAT, VERSION, from_json, to_json
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy, exact_policy


def _toy(n_layers=5, tied=False):
    return ModelSpec(name="toy", n_layers=n_layers, hidden=64, n_heads=4, n_kv_heads=2,
                     ffn_hidden=160, vocab=320, tied_embeddings=tied)


CASES = {
    "default": (_toy(), Policy(batch=2, seq=32)),
    "k3-host-pipelined-mb2": (_toy(7), Policy(batch=4, seq=32, act_ckpt_every=3, slots=3,
                                               micro_batches=2, act_ckpt_on="host")),
    "k2-device-after-tied": (_toy(5, tied=True), Policy(batch=2, seq=32, act_ckpt_every=2,
                                                         act_ckpt_on="device", optimizer="after")),
    "backward-noclip-fp32": (_toy(4), exact_policy(batch=2, seq=16, optimizer="backward",
                                                   grad_clip=0.0, slots=4)),
    "qwen-0.5b-preset": (model_preset("qwen2.5-0.5b"), Policy(batch=4, seq=1024, act_ckpt_every=4)),
}


@pytest.mark.parametrize("case", CASES)
def test_round_trip_is_lossless(case):
    model, policy = CASES[case]
    sched = build_schedule(model, policy)
    text = to_json(sched)
    back = from_json(text)
    assert back.ops == sched.ops
    assert back.buffers == sched.buffers
    assert list(back.buffers) == list(sched.buffers)  # order kept too
    assert back.meta == sched.meta
    assert to_json(back) == text  # stable: writing it again gives the same bytes
    # kinds come back as enums, tuples as tuples (not lists): they hash and compare
    assert all(isinstance(op.kind, OpKind) and isinstance(op.deps, tuple) for op in back.ops)
    assert back.meta.policy == policy and back.meta.model == model  # typed specs, not dicts


# ---- tampering ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def doc():
    model, policy = CASES["k2-device-after-tied"]
    return json.loads(to_json(build_schedule(model, policy)))


def _load(d) -> None:
    from_json(json.dumps(d))


def _op(d, kind, layer):
    return next(o for o in d["ops"] if o["kind"] == kind and o["unit"] == layer)


def _copy(d):
    return json.loads(json.dumps(d))


def test_untampered_doc_loads(doc):
    _load(doc)
    assert doc["format"] == FORMAT and doc["version"] == VERSION


def test_cycle_is_rejected(doc):
    d = _copy(doc)
    fwd = _op(d, "forward", 0)
    load = d["ops"][fwd["deps"][0]]
    assert load["kind"] == "load_weights"
    load["deps"] = load.get("deps", []) + [fwd["id"]]
    with pytest.raises(ScheduleError, match="cycle"):
        _load(d)


def test_missing_dependency_is_rejected(doc):
    d = _copy(doc)
    og = _op(d, "offload_grads", 3)
    bwd = _op(d, "backward", 3)
    assert bwd["id"] in og["deps"]
    og["deps"] = [x for x in og["deps"] if x != bwd["id"]]
    with pytest.raises(ScheduleError, match=r"reads 'dgrad\.3\.m0' without waiting"):
        _load(d)


def test_dependency_on_nonexistent_op_is_rejected(doc):
    d = _copy(doc)
    d["ops"][2]["deps"] = [len(d["ops"]) + 5]
    with pytest.raises(ScheduleError, match="does not exist"):
        _load(d)


def test_unknown_op_kind_is_rejected(doc):
    d = _copy(doc)
    d["ops"][1]["kind"] = "teleport"
    with pytest.raises(ScheduleError, match="unknown kind 'teleport'"):
        _load(d)


def test_unknown_buffer_is_rejected(doc):
    d = _copy(doc)
    d["buffers"] = [b for b in d["buffers"] if b["name"] != "w1"]
    with pytest.raises(ScheduleError, match="unknown buffer 'w1'"):
        _load(d)


@pytest.mark.parametrize("version", [0, 1, 5, "3", None])
def test_wrong_version_is_rejected(doc, version):
    d = _copy(doc)
    d["version"] = version
    with pytest.raises(ScheduleError, match="version"):
        _load(d)


def test_version_2_files_still_read(doc):
    """Version 2 spelled the layout flat and a peer's family in notes[0]."""
    from horizon_sim.peer.zero3_builder import build_zero3_schedule
    from horizon_sim.peer.zero3_policy import Zero3Policy
    from horizon_sim.specs.layout import Layout
    model = CASES["default"][0]
    for sched in (build_schedule(model, Policy(batch=2, seq=32), Layout(2, 2)),
                  build_zero3_schedule(model, Zero3Policy(batch=2, seq=32))):
        d = json.loads(to_json(sched))
        meta = d["meta"]
        layout, family = meta.pop("layout"), meta.pop("family")
        meta.update(layout, notes=[] if family == "horizon" else [family])
        d["version"] = 2
        back = from_json(json.dumps(d))
        assert back.meta == sched.meta and back.meta.family == family
    assert [family, back.meta.layout] == ["zero3-offload", Layout(1, 1)]


def test_missing_version_is_rejected(doc):
    d = _copy(doc)
    del d["version"]
    with pytest.raises(ScheduleError, match="version"):
        _load(d)


@pytest.mark.parametrize("fmt", ["horizon.timeline", "", None])
def test_wrong_format_is_rejected(doc, fmt):
    d = _copy(doc)
    d["format"] = fmt
    with pytest.raises(ScheduleError, match="not a Horizon schedule"):
        _load(d)


@pytest.mark.parametrize("text", ["", "{", '{"format": "horizon.schedule",', "not json", "[1, 2"])
def test_malformed_json_is_rejected(text):
    with pytest.raises(ScheduleError, match="malformed"):
        from_json(text)


def test_truncated_file_is_rejected(doc):
    text = json.dumps(doc)
    with pytest.raises(ScheduleError, match="malformed"):
        from_json(text[: len(text) // 2])


@pytest.mark.parametrize("value", [[], 3, "x", None])
def test_json_that_is_not_an_object_is_rejected(value):
    with pytest.raises(ScheduleError, match="not a Horizon schedule"):
        from_json(json.dumps(value))


def test_unknown_op_field_is_rejected(doc):
    d = _copy(doc)
    d["ops"][3]["colour"] = "red"
    with pytest.raises(ScheduleError, match=r"unknown field\(s\) \['colour'\]"):
        _load(d)


@pytest.mark.parametrize("breakage", ["no_ops", "no_meta", "short_buffer", "op_no_unit",
                                      "bad_space", "bad_meta_field"])
def test_structurally_broken_doc_is_rejected(doc, breakage):
    d = _copy(doc)
    if breakage == "no_ops":
        del d["ops"]
    elif breakage == "no_meta":
        del d["meta"]
    elif breakage == "short_buffer":
        del d["buffers"][0]["bytes"]
    elif breakage == "op_no_unit":
        del d["ops"][0]["unit"]
    elif breakage == "bad_space":
        d["buffers"][0]["space"] = "cloud"
    else:
        d["meta"]["colour"] = "red"
    with pytest.raises(ScheduleError):
        _load(d)


def test_removed_free_is_rejected(doc):
    d = _copy(doc)
    og = _op(d, "offload_grads", 2)
    assert og["frees"] == ["dgrad.2.m0"]
    del og["frees"]
    with pytest.raises(ScheduleError, match="does not balance"):
        _load(d)
