"""The peer's host memory beyond its model states (horizon_sim/peer/host_extras.py):
DeepSpeedCPUAdam's page-locked tiles (adam_tile_params) and the copy-on-write copies of the
pageable host state in a trainer that forked its data-loader workers after allocating it
(fork_copies); both off by default, as DeepSpeed 0.19 runs without workers. Planner only."""
import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.peer.compare import parse_knobs, plan_zero3
from horizon_sim.peer.zero3_builder import build_zero3_schedule
from horizon_sim.peer.zero3_policy import Zero3Policy
from horizon_sim.schedule.op import Holds
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model import ModelSpec

M = ModelSpec(name="s4", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=688, vocab=512)
HW = make_hardware("h200", "1.5TB")


def host(**kw) -> dict:
    r = plan_zero3(M, HW, Zero3Policy(batch=2, seq=64, **kw))
    return r.host.by_role


@pytest.mark.parametrize("family", [dict(), dict(offload_param=False), dict(offload_param=False,
                                                                            adam_copies_params=True)])
def test_off_by_default_adds_nothing(family):
    s = build_zero3_schedule(M, Zero3Policy(batch=2, seq=64, **family))
    assert not any(b.holds in (Holds.ADAM_TILES, Holds.FORK_COPY) for b in s.buffers.values())
    assert "fork_copies" not in host(**family)


@pytest.mark.parametrize("family", [dict(), dict(offload_param=False)])
def test_the_adam_tiles_are_two_page_locked_fp32_tiles(family):
    base, tiles = host(**family), host(adam_tile_params=1 << 20, **family)
    assert tiles["staging"] - base["staging"] == 2 * 4 * (1 << 20)
    assert {k: v for k, v in tiles.items() if k != "staging"} == {k: v for k, v in base.items() if k != "staging"}


@pytest.mark.parametrize("family", [dict(), dict(offload_param=False), dict(offload_param=False,
                                                                            adam_copies_params=True)])
def test_fork_copies_hold_the_pageable_state_twice(family):
    """With page-locked buffers (pin_memory), the master and moments are copied: 12 bytes a
    parameter in fp32; with pin_memory off every static host buffer the step writes is."""
    pinned = host(fork_copies=True, **family)
    assert pinned["fork_copies"] == pinned["master"] + pinned["moments"]
    assert pinned["fork_copies"] == 12 * M.total_params
    pageable = host(fork_copies=True, pin_memory=False, **family)
    assert pageable["fork_copies"] == sum(pageable[k] for k in ("master", "moments", "grads", "working_copy"))


def test_the_knobs_parse_and_refuse_bad_values():
    assert parse_knobs("adam_tile_params=1073741824,fork_copies=on") == {"adam_tile_params": 1 << 30,
                                                                        "fork_copies": True}
    with pytest.raises(HorizonError, match="adam_tile_params"):
        Zero3Policy(adam_tile_params=-1)
    with pytest.raises(HorizonError, match="fork_copies"):
        Zero3Policy(fork_copies=1)
