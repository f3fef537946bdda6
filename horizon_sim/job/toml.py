"""A Job to and from its TOML file (docs/job.md).

    format = "horizon.job"
    version = 1
    [model] ... [run] ... [policy] ... [optimizer] ... [data] ... [outputs] ... [prediction] ...
    [hardware]            # the machine, as a hardware file writes it (specs/hardware_io.py),
    name = "..."          # its tables one level down: [hardware.device], [hardware.link],
    [hardware.device]     # [hardware.host], [hardware.cluster] for a data-parallel machine
    ...

Written with hardware_io's own TOML writer (toml_value, _toml_line, _table_items), so the
[hardware] tables read back exactly as a hardware file does (hardware_from_dict); TOML has no
null, so a value that is None is left out and reads back as None. write -> read -> write gives
the same text. Read with safe_read.read_toml; every problem with a file (not TOML, an unknown
key with the closest known one, a missing key, a wrong type, a value out of range, a policy
the planner refuses) is one HorizonError line naming the file and the key.
"""
from dataclasses import MISSING, fields
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.job.sections import FORMAT, SECTIONS, VERSION, Job, check_types
from horizon_sim.safe_files import write_atomic
from horizon_sim.safe_read import read_toml_file
from horizon_sim.specs.cluster import SINGLE
from horizon_sim.specs.hardware_io import TABLES, _table_items, _toml_line, hardware_from_dict, toml_value
from horizon_sim.specs.policy import Policy
from horizon_sim.units import refuse_unknown

TOP_LEVEL = ("format", "version", *SECTIONS, "hardware")
REQUIRED = ("model", "policy", "prediction", "hardware")
"""Tables a job must have; the others ([run], [optimizer], [data], [outputs]) default to
`horizon train`'s own defaults."""
HEADER = ("# Horizon job (docs/job.md): a model, a machine, a resolved policy, the training side and the",
          "# plan's prediction. Edit it freely; `horizon train --job FILE` trains it. Units are in the",
          "# key names: _s seconds, _bytes bytes, GiB = 2**30 bytes, GBps = 1e9 bytes/s.")


def _section_lines(name: str, obj) -> list[str]:
    d = obj.to_dict() if isinstance(obj, Policy) else {f.name: getattr(obj, f.name) for f in fields(obj)}
    return ["", f"[{name}]"] + [_toml_line(k, v) for k, v in d.items() if v is not None]


def job_to_toml(job: Job) -> str:
    """The file's text (module docstring)."""
    lines = [*HEADER, f"format = {toml_value(FORMAT)}", f"version = {VERSION}"]
    for name in SECTIONS:
        lines += _section_lines(name, getattr(job, name))
    hw = job.hardware
    lines += ["", "[hardware]", f"name = {toml_value(hw.name)}"]
    for table in (*TABLES, *(["cluster"] if hw.cluster != SINGLE else [])):
        lines += ["", f"[hardware.{table}]"] + [_toml_line(k, v) for k, v in _table_items(getattr(hw, table))]
    return "\n".join(lines) + "\n"


def write_job(job: Job, path) -> Path:
    """Write `job` to `path` atomically (a failure leaves the old file or none, never half one)."""
    return write_atomic(path, job_to_toml(job).encode("utf-8"), "the job file")


def check_job_path(path) -> None:
    """Refuse an output path the job cannot be written to, before any planning (a folder, a
    missing parent folder, a FIFO)."""
    from horizon_sim.safe_files import refuse_non_regular
    p = Path(path)
    if p.is_dir():
        raise HorizonError(f"--save-job {str(path)!r} is a folder; give a file name (e.g. job.toml)")
    if not p.parent.is_dir():
        raise HorizonError(f"--save-job {str(path)!r}: folder {str(p.parent)!r} does not exist")
    refuse_non_regular(p, "--save-job")


def _section(name: str, cls, body, where: str):
    """The section `name` of type `cls` from its table `body`."""
    if not isinstance(body, dict):
        raise HorizonError(f"{where}: {name} = {body!r} must be a table [{name}]")
    known = [f.name for f in fields(cls)]
    refuse_unknown(body, known, where, table=name)
    for f in fields(cls):
        if f.name not in body and f.default is MISSING and f.default_factory is MISSING:
            raise HorizonError(f"{where}: [{name}] is missing key {f.name!r}")
    try:
        return _policy(body) if cls is Policy else cls(**body)
    except HorizonError as e:
        raise HorizonError(f"{where}: {e}") from None


def _policy(body: dict) -> Policy:
    """A Policy from its table; a number where the policy takes a float (grad_clip) is that
    float, so the Schedule (and its digest) is the one the planner built."""
    probe = Policy()
    floats = {f.name for f in fields(Policy) if isinstance(getattr(probe, f.name), float)}
    body = {k: float(v) if k in floats and isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in body.items()}
    p = Policy(**body)
    check_types(p, "policy")  # what Policy does not check itself: a bool given as a string, say
    return p


def job_from_dict(data: dict, where: str = "job") -> Job:
    """A Job from the parsed TOML document; errors start with `where` (the file)."""
    if not isinstance(data, dict):
        raise HorizonError(f"{where}: expected a table")
    refuse_unknown(data, TOP_LEVEL, where, "allowed at top level")
    if data.get("format") != FORMAT:
        raise HorizonError(f"{where}: format = {data.get('format')!r}; a job file says format = {FORMAT!r}"
                           + (" (this looks like a hardware file: give it to --hardware)" if "device" in data else ""))
    if data.get("version") != VERSION:
        raise HorizonError(f"{where}: version = {data.get('version')!r}; this Horizon reads version {VERSION}")
    for key in REQUIRED:
        if key not in data:
            raise HorizonError(f"{where}: missing table [{key}]")
    parts = {name: _section(name, cls, data[name], where) for name, cls in SECTIONS.items() if name in data}
    if not isinstance(data["hardware"], dict):
        raise HorizonError(f"{where}: hardware = {data['hardware']!r} must be a table [hardware]")
    parts["hardware"] = hardware_from_dict(data["hardware"], f"{where} [hardware]")
    try:
        return Job(**parts)
    except HorizonError as e:
        raise HorizonError(f"{where}: {e}") from None


def read_job(path) -> Job:
    """The Job in the file at `path` (module docstring)."""
    where = f"job file {str(path)!r}"
    return job_from_dict(read_toml_file(path, where), where)


def load_hardware_or_job(path):
    """The HardwareSpec of a hardware file, or of a job file's [hardware] (what `horizon train
    --job` hands its admission and MFU as --hardware)."""
    where = f"hardware file {str(path)!r}"
    data = read_toml_file(path, where)
    if isinstance(data, dict) and data.get("format") == FORMAT:
        return job_from_dict(data, f"job file {str(path)!r}").hardware
    return hardware_from_dict(data, where)

