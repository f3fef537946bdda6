"""The shared host DRAM bus: max-min fair sharing worked by hand.

Units are arbitrary (bytes and seconds with a bus of 10 B/s) so every finish time is a round
number one can check on paper."""
import pytest
import simpy

from horizon_sim.sim.dram import DramBus

CAP = 10.0  # bus capacity, B/s


def _run(flows, lane_cores: float = 0.0, bus_Bps: float = CAP):
    """flows: (start_s, nbytes, cap_Bps[, core]). Returns each flow's finish time."""
    env = simpy.Environment()
    bus = DramBus(env, bus_Bps, lane_cores)
    done = [None] * len(flows)

    def proc(i, start, nbytes, cap, core=False):
        if start:
            yield env.timeout(start)
        yield bus.transfer(nbytes, cap, core)
        done[i] = env.now

    for i, f in enumerate(flows):
        env.process(proc(i, *f))
    env.run()
    return done


def test_single_flow_runs_at_its_cap():
    assert _run([(0, 30, 3)]) == pytest.approx([10.0])


def test_single_flow_limited_by_the_bus():
    assert _run([(0, 50, 100)]) == pytest.approx([5.0])


def test_two_equal_flows_split_the_bus():
    # each capped at 8 > 10/2, so each gets 5 B/s: 100 B in 20 s
    assert _run([(0, 100, 8), (0, 100, 8)]) == pytest.approx([20.0, 20.0])


def test_two_flows_whose_caps_fit_are_not_slowed():
    # 4 + 5 <= 10: both at their caps
    assert _run([(0, 40, 4), (0, 40, 5)]) == pytest.approx([10.0, 8.0])


def test_capped_flow_leaves_the_rest_to_the_other():
    """A (cap 3) gets 3, B (cap 100) gets the remaining 7. A: 30 B at 3 -> t=10. B: 70 B by
    t=10, then the whole bus for its last 30 B -> t=13."""
    assert _run([(0, 30, 3), (0, 100, 100)]) == pytest.approx([10.0, 13.0])


def test_flow_arriving_midway():
    """A alone at 10 B/s for 5 s (50 of 100 B). B (20 B) arrives at t=5: 5 B/s each, B done at
    t=9, A has 30 B left and the whole bus again -> t=12."""
    assert _run([(0, 100, 100), (5, 20, 100)]) == pytest.approx([12.0, 9.0])


def test_capped_flow_arriving_midway():
    """A alone at 10 B/s for 2 s (20 of 100 B). B (cap 2, 10 B) arrives at t=2: B gets 2, A 8.
    B done at t=7, A has 80 - 5·8 = 40 B left at 10 B/s -> t=11."""
    assert _run([(0, 100, 100), (2, 10, 2)]) == pytest.approx([11.0, 7.0])


def test_three_flows_max_min_fair():
    """caps 1, 4, 100 on 10 B/s: the cap-1 flow takes 1, the rest (9) is split: the cap-4 flow
    takes 4 (< 4.5), the third 5.
      A: 10 B at 1 -> t=10.  B: 20 B at 4 -> t=5.  C: 100 B at 5 until t=5 (25 B), then 9 B/s
      (A takes 1) until t=10 (45 more, 30 left), then 10 B/s -> t=13."""
    assert _run([(0, 10, 1), (0, 20, 4), (0, 100, 100)]) == pytest.approx([10.0, 5.0, 13.0])


def test_zero_byte_transfer_is_done_at_once():
    assert _run([(3, 0, 5)]) == pytest.approx([3.0])


def test_sequential_flows_do_not_interfere():
    # the second starts after the first ended: no sharing
    assert _run([(0, 10, 100), (2, 10, 100)]) == pytest.approx([1.0, 3.0])


def test_total_bytes_conserved_under_churn():
    """Many overlapping flows: the bus is never idle while work remains, so with every cap at
    or above the bus rate the last one ends exactly at total bytes / capacity."""
    flows = [(0.5 * i, 7.0 + 3 * i, 100.0) for i in range(12)]
    done = _run(flows)
    total = sum(f[1] for f in flows)
    assert max(done) == pytest.approx(total / CAP, rel=1e-9)
    assert all(d >= s + n / CAP - 1e-9 for d, (s, n, _) in zip(done, flows))


def _run_bounded(env, max_steps=10_000):
    """env.run(), but give up after max_steps events instead of spinning forever."""
    for _ in range(max_steps):
        if env.peek() == float("inf"):
            return True
        env.step()
    return False


def test_flow_shorter_than_the_clock_resolution_finishes():
    """Regression: late in a long step (t = 1e6 s, where one float ulp is ~1.2e-10 s) a flow
    whose remaining time (2e-3 B at 3e11 B/s = 7e-15 s) is below the clock's resolution used
    to time out at the same instant, make no progress and spin forever."""
    env = simpy.Environment()
    bus = DramBus(env, 3e11)
    done = []

    def proc():
        yield env.timeout(1e6)
        yield bus.transfer(2e-3, 3e11)
        done.append(env.now)

    env.process(proc())
    assert _run_bounded(env), "the bus never finished a sub-resolution flow"
    assert done == [pytest.approx(1e6, abs=1e-9)]


def test_flows_on_one_core_share_it():
    """Worked by hand, a bus far faster than the flows. One core: a copy (10 B at 1 B/s) and an
    optimizer update (10 B at 2 B/s) together each run at half speed: the update finishes at
    t=10 (5 B/s... half of 2 B/s = 1 B/s for 10 s), the copy has 5 B left, alone again at
    1 B/s -> t=15. Two cores: no sharing, t=10 and t=5. A DMA copy (not a core flow) is not
    slowed by the update."""
    assert _run([(0, 10, 1, True), (0, 10, 2, True)], 1, bus_Bps=100.0) == pytest.approx([15.0, 10.0])
    assert _run([(0, 10, 1, True), (0, 10, 2, True)], 2, bus_Bps=100.0) == pytest.approx([10.0, 5.0])
    assert _run([(0, 10, 1, False), (0, 10, 2, True)], 1, bus_Bps=100.0) == pytest.approx([10.0, 5.0])
    assert _run([(0, 10, 1, True), (0, 10, 2, True)], 0, bus_Bps=100.0) == pytest.approx([10.0, 5.0])
