"""Schedule <-> JSON, with a format version. Loading checks the structure, so a tampered file (a cycle, a
missing dependency, an unknown op kind, another version) is rejected with a ScheduleError."""
import json
from dataclasses import asdict, fields

from horizon_sim.errors import HorizonError
from horizon_sim.safe_read import ReadError, loads_json
from horizon_sim.schedule.check import ScheduleError
from horizon_sim.schedule.op import Buffer, Family, Holds, Op, OpKind, ScheduleMeta, Space
from horizon_sim.schedule.schedule import Schedule
from horizon_sim.specs.from_dict import spec_from_dict
from horizon_sim.specs.layout import Layout
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

FORMAT = "horizon.schedule"
VERSION = 4  # 4: the meta model's family (was qk_norm, moe_family, ffn_type, norm: read as the family
#              they described, specs/families/legacy.py), padding_idx, rotary_fraction, attn_softcap,
#              logit_softcap, query_scale
#           3: meta layout {devices_per_node, nodes} and family (were flat fields and notes); op unit (was layer)
READS = (2, 3, 4)  # 2: policy act_ckpt_every/act_ckpt_on (were ckpt_every/ckpt_on), typed fields
_OP_FIELDS = {f.name for f in fields(Op)}
_OP_DEFAULTS = {f.name: f.default for f in fields(Op) if f.name not in ("id", "kind", "unit")}


_BUFFER_FIELDS = {f.name for f in fields(Buffer)}
_BUFFER_DEFAULTS = {f.name: f.default for f in fields(Buffer) if f.name not in ("name", "space", "bytes", "static")}


def _buffer_json(b: Buffer) -> dict:
    d = {k: v for k, v in asdict(b).items() if k not in _BUFFER_DEFAULTS or v != _BUFFER_DEFAULTS[k]}
    d["space"] = b.space.value
    if b.holds is not None:
        d["holds"] = b.holds.value
    if b.shape:
        d["shape"] = list(b.shape)
    return d


def _meta_json(meta: ScheduleMeta) -> dict:
    d = {f.name: getattr(meta, f.name) for f in fields(ScheduleMeta)}
    return dict(d, model=meta.model.to_dict(), policy=meta.policy.to_dict(), layout=asdict(meta.layout),
                family=meta.family.value)


def _meta_of(d: dict, version: int) -> ScheduleMeta:
    d = dict(d)
    if version == 2:  # flat layout; notes[0] named a peer family
        d["layout"] = {"devices_per_node": d.pop("devices_per_node", 1), "nodes": d.pop("nodes", 1)}
        notes = d.pop("notes", ())
        d["family"] = notes[0] if notes else "horizon"
    try:
        family = Family(d.get("family", Family.HORIZON.value))
    except ValueError:
        raise ScheduleError(f"schedule meta family {d.get('family')!r} is unknown; known: "
                            f"{', '.join(f.value for f in Family)}") from None
    return ScheduleMeta(**dict(d, family=family, model=ModelSpec.from_dict(d["model"], "schedule meta model"),
                               policy=Policy.from_dict(d["policy"], "schedule meta policy"),
                               layout=spec_from_dict(Layout, d.get("layout", {}), "schedule meta layout")))


def to_json(sched: Schedule) -> str:
    ops = []
    for op in sched.ops:
        # Fields at their default are left out: the file stays small and diffable.
        d = {k: v for k, v in asdict(op).items() if k not in _OP_DEFAULTS or v != _OP_DEFAULTS[k]}
        d["kind"] = op.kind.value
        ops.append(d)
    doc = {
        "format": FORMAT, "version": VERSION,
        "meta": _meta_json(sched.meta),
        "buffers": [_buffer_json(b) for b in sched.buffers.values()],
        "ops": ops,
    }
    return json.dumps(doc, separators=(",", ":"))


def from_json(text: str) -> Schedule:
    try:
        doc = loads_json(text, "schedule JSON")
    except ReadError as e:  # every parse failure (safe_read.py), as this module's error type
        raise ScheduleError(f"schedule JSON is malformed: {e.why}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ScheduleError(f"not a Horizon schedule (format {doc.get('format') if isinstance(doc, dict) else None!r})")
    if doc.get("version") not in READS:
        raise ScheduleError(f"schedule format version {doc.get('version')!r} is not supported; this "
                            f"Horizon reads versions {', '.join(map(str, READS))}")
    try:
        buffers = {}
        for d in doc["buffers"]:
            unknown = set(d) - _BUFFER_FIELDS
            if unknown:
                raise ScheduleError(f"buffer {d.get('name')!r} has unknown field(s) {sorted(unknown)}")
            try:
                b = Buffer(**dict(d, space=Space(d["space"]), holds=Holds(d["holds"]) if d.get("holds") else None))
            except ValueError as e:
                raise ScheduleError(f"buffer {d.get('name')!r}: {e}") from None
            buffers[b.name] = b
        ops = []
        for d in doc["ops"]:
            if doc["version"] == 2 and isinstance(d, dict) and "layer" in d:  # version 2 named the unit 'layer'
                d = {("unit" if k == "layer" else k): v for k, v in d.items()}
            unknown = set(d) - _OP_FIELDS
            if unknown:
                raise ScheduleError(f"op {d.get('id')} has unknown field(s) {sorted(unknown)}")
            try:
                kind = OpKind(d["kind"])
            except ValueError:
                raise ScheduleError(f"op {d.get('id')} has unknown kind {d['kind']!r}; known: "
                                    f"{', '.join(k.value for k in OpKind)}") from None
            d = dict(d, kind=kind)
            for k in ("deps", "reads", "writes", "frees"):
                d[k] = tuple(d.get(k, ()))
            ops.append(Op(**d))
        meta = _meta_of(doc["meta"], doc["version"])
    except ScheduleError:
        raise
    except HorizonError as e:  # a spec in the meta that its own checks refuse
        raise ScheduleError(f"schedule JSON: {e}") from None
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ScheduleError(f"schedule JSON has a malformed entry: {e!r}") from None
    return Schedule(ops=tuple(ops), buffers=buffers, meta=meta).check()
