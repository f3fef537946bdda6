"""A peer beside Horizon on the same model, machine and batch (horizon_sim/peer): its step as
an Outcome, chosen by the peer's name, and the columns it adds to a sweep's row."""
import math

from horizon_sim.errors import HorizonError
from horizon_sim.plan.outcome import Outcome, outcome_of
from horizon_sim.specs.hardware import HardwareSpec
from horizon_sim.specs.model import ModelSpec
from horizon_sim.specs.policy import Policy
from horizon_sim.units import closest

PEER_COLUMNS = ("peer_fits", "peer_tokens_per_s", "speedup", "peer_device_peak_bytes", "peer_host_bytes",
                "peer_bottleneck", "peer_error")
"""Added by sweep(compare=...): the peer on the same model, machine and batch."""


def simulate_zero3_outcome(model: ModelSpec, hw: HardwareSpec, policy: Policy) -> Outcome:
    """The ZeRO-3-offload peer on the same batch, as an Outcome; a layout or policy it does not
    take becomes an Outcome with `error` set."""
    from horizon_sim.peer.compare import plan_zero3, zero3_like
    try:
        r = plan_zero3(model, hw, zero3_like(policy))
    except HorizonError as e:
        return Outcome(error=str(e).splitlines()[0])
    return outcome_of(r)


PEER_OUTCOMES = {"zero3-offload": simulate_zero3_outcome}
"""Peer name (horizon_sim.peer.compare.PEERS) -> how its step becomes an Outcome."""


def check_peer(peer) -> None:
    """A one-line HorizonError unless `peer` names a peer Horizon can be compared with."""
    if peer not in PEER_OUTCOMES:
        hint = closest(peer, PEER_OUTCOMES) if isinstance(peer, str) else ""
        raise HorizonError(f"unknown peer {peer!r}{hint}; allowed: {', '.join(PEER_OUTCOMES)}")


def simulate_peer_outcome(peer: str, model: ModelSpec, hw: HardwareSpec, policy: Policy) -> Outcome:
    """The step of the peer named `peer` on the same model, machine and batch, as an Outcome."""
    check_peer(peer)
    return PEER_OUTCOMES[peer](model, hw, policy)


def peer_row(hw: HardwareSpec, ours: Outcome, peer: Outcome) -> dict:
    """The PEER_COLUMNS of one row: the peer's figures, and Horizon's speedup over it."""
    speed = ours.tokens_per_s / peer.tokens_per_s if ours.ok and peer.ok and peer.tokens_per_s else math.nan
    return {"peer_fits": peer.fits(hw), "peer_tokens_per_s": peer.tokens_per_s, "speedup": speed,
            "peer_device_peak_bytes": peer.device_peak_bytes, "peer_host_bytes": peer.host_bytes,
            "peer_bottleneck": peer.bottleneck, "peer_error": peer.error}
