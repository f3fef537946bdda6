"""A peer beside Horizon on the same model, machine and batch (a family of plan/families.py):
its step as an Outcome, chosen by the peer's name, and the columns it adds to a sweep's row."""
import math

from horizon_sim.errors import HorizonError
from horizon_sim.plan.outcome import Outcome, outcome_of
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy

PEER_COLUMNS = ("peer_fits", "peer_tokens_per_s", "speedup", "peer_device_peak_bytes", "peer_host_bytes",
                "peer_bottleneck", "peer_error")
"""Added by sweep(compare=...): the peer on the same model, machine and batch."""


def check_peer(name) -> None:
    """A one-line HorizonError unless `name` names a peer Horizon can be compared with."""
    from horizon_sim.plan.families import peer
    peer(name)


def simulate_peer_outcome(name: str, model: ModelSpec, hw: HardwareSpec, policy: Policy) -> Outcome:
    """The step of the peer named `name` on the same batch as `policy`, as an Outcome; a layout
    or policy it does not take becomes an Outcome with `error` set."""
    from horizon_sim.plan.families import peer
    fam = peer(name)
    try:
        r = fam.plan(model, hw, fam.like(policy))
    except HorizonError as e:
        return Outcome(error=str(e).splitlines()[0])
    return outcome_of(r)


def peer_row(hw: HardwareSpec, ours: Outcome, peer: Outcome) -> dict:
    """The PEER_COLUMNS of one row: the peer's figures, and Horizon's speedup over it."""
    speed = ours.tokens_per_s / peer.tokens_per_s if ours.ok and peer.ok and peer.tokens_per_s else math.nan
    return {"peer_fits": peer.fits(hw), "peer_tokens_per_s": peer.tokens_per_s, "speedup": speed,
            "peer_device_peak_bytes": peer.device_peak_bytes, "peer_host_bytes": peer.host_bytes,
            "peer_bottleneck": peer.bottleneck, "peer_error": peer.error}
