"""Digests that say whether two processes mean the same model and run the same Schedule.

model_digest: sha256 of the canonical JSON (keys sorted, no spaces) of ModelSpec.to_dict().
schedule_digest: sha256 of the Schedule's JSON (schedule/serialize.py to_json): every op with its
lane, work and buffers, every buffer with its type, and the meta (model, policy, layout). That
text is built in program order from dicts in insertion order and lists, with no sets and no
hashes, so it is the same in every process (tests/test_job_file.py runs two interpreters with
different hash seeds). Both are written 'sha256:<64 hex digits>'; short() is what a log shows.
"""
import hashlib
import json

from horizon_sim.schedule.schedule import Schedule
from horizon_sim.specs.model import ModelSpec

PREFIX = "sha256:"


def _sha(text: str) -> str:
    return PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()


def model_digest(model: ModelSpec) -> str:
    """The digest of a resolved model: equal for equal specs, whoever resolved them."""
    return _sha(json.dumps(model.to_dict(), sort_keys=True, separators=(",", ":")))


def schedule_digest(sched: Schedule) -> str:
    """The digest of one step's Schedule (module docstring)."""
    from horizon_sim.schedule.serialize import to_json
    return _sha(to_json(sched))


def short(digest: str) -> str:
    """The first 12 hex digits, for a log line."""
    return digest.removeprefix(PREFIX)[:12]


def planner_version() -> str:
    """'horizon <package version>, schedule format <N>': what made a prediction."""
    from importlib.metadata import PackageNotFoundError, version

    from horizon_sim.schedule.serialize import VERSION
    try:
        v = version("horizon")
    except PackageNotFoundError:  # run from a source tree that was never installed
        v = "unknown"
    return f"horizon {v}, schedule format {VERSION}"
