"""The search verbs' Python APIs: tune, min_ram, max_model, sweep, advise.

Small models, short sequences and reduced search spaces keep this file to a few seconds; every
claim a search makes is checked by an independent simulation with plan()."""
import math

import pandas as pd
import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.plan import plan
from horizon_sim.plan.advice import MIN_GAIN, advise, nearest_fit, policy_flags
from horizon_sim.plan.max_model import POLICY_SETS, candidates, host_lower_bound, max_model, policy_set
from horizon_sim.plan.min_ram import min_ram
from horizon_sim.report.feasibility_map import feasibility_map
from horizon_sim.plan.grid import parse_grid
from horizon_sim.plan.outcome import RAM_STEP_BYTES, round_up_ram, simulate_outcome
from horizon_sim.plan.runner import Runner
from horizon_sim.plan.sweep import sweep, write_results
from horizon_sim.plan.tune import SearchSpace, pareto_front, tune
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL = SearchSpace(micro_batch=(1, 2, 4, 8), micro_batches=(1, 2), act_ckpt_every=(1, 2), slots=(2, 3),
                    max_batch=16)


def _fits(model, hw, policy) -> bool:
    return plan(model, hw, policy).summary.fits


# ---- tune ---------------------------------------------------------------------------------
def test_tune_is_at_least_as_fast_as_the_default_and_fits():
    model, hw = model_preset("tiny"), make_hardware("h100-pcie", "64GiB")
    res = tune(model, hw, 256, space=SMALL, workers=1)
    default = plan(model, hw, Policy(seq=256)).summary
    assert default.fits and res.baseline["fits"]
    check = plan(model, hw, res.best).summary
    assert check.fits
    assert check.tokens_per_s >= default.tokens_per_s
    assert res.table.iloc[0].policy == res.best
    assert res.evaluated >= 10 and len(res.top(5)) <= 5
    # the front: RAM up, speed up, every row fits the device
    p = res.pareto
    assert len(p) >= 1
    assert p.ram_needed_bytes.is_monotonic_increasing and p.tokens_per_s.is_monotonic_increasing
    assert (p.device_peak_bytes <= hw.device_bytes_usable).all()
    assert (p.ram_needed_bytes % RAM_STEP_BYTES == 0).all()


def test_tune_finds_a_fit_when_the_default_does_not():
    # 17 GiB on an RTX 4090's desktop host (6 GiB kept for the OS): the default policy does not fit
    model, hw = model_preset("qwen2.5-0.5b"), make_hardware("rtx-4090", "17GiB")
    res = tune(model, hw, 512, space=SMALL, workers=1)
    assert not res.baseline["fits"]
    assert res.best is not None and _fits(model, hw, res.best)


def test_tune_uses_optimizer_backward_only_without_clipping():
    model, hw = model_preset("tiny"), make_hardware("h100-pcie", "64GiB")
    space = SearchSpace(micro_batch=(2, 4), micro_batches=(1,), act_ckpt_every=(1,), slots=(2,), max_batch=8)
    clipped = tune(model, hw, 128, space=space, workers=1)
    assert "backward" not in set(clipped.table.optimizer)
    free = tune(model, hw, 128, base=Policy(grad_clip=0.0), space=space, workers=1)
    assert "backward" in set(free.table.optimizer)
    assert all(p.grad_clip == 0 for p in free.table.policy)


def test_tune_reports_nothing_fits_as_best_none():
    model, hw = model_preset("llama-3.1-8b"), make_hardware("rtx-4090", "32GiB")
    space = SearchSpace(micro_batch=(1,), micro_batches=(1,), act_ckpt_every=(1,), slots=(2,), max_batch=1)
    res = tune(model, hw, 256, space=space, workers=1)
    assert res.best is None and not res.table.fits.any()


@pytest.mark.parametrize("bad", [dict(micro_batch=()), dict(slots=(1, 2)), dict(max_batch=0),
                                 dict(optimizer=("sometimes",)), dict(act_ckpt_every=(0,))])
def test_search_space_rejects_bad_values(bad):
    with pytest.raises(HorizonError):
        SearchSpace(**bad)


def test_tune_rejects_bad_seq():
    with pytest.raises(HorizonError, match="seq"):
        tune(model_preset("tiny"), make_hardware("h100-pcie", "64GiB"), 0)


def test_pareto_front_keeps_only_improvements():
    df = pd.DataFrame({"ram_needed_bytes": [1, 1, 2, 3, 3], "tokens_per_s": [5.0, 7.0, 6.0, 9.0, 8.0],
                       "host_bytes": [1, 1, 2, 3, 3]})
    front = pareto_front(df)
    assert front.tokens_per_s.tolist() == [7.0, 9.0]


# ---- min-ram ------------------------------------------------------------------------------
def test_min_ram_fits_and_64_GiB_less_does_not():
    model, policy = model_preset("llama-3.1-8b"), Policy(seq=512)
    hw = make_hardware("h100-pcie")
    r = min_ram(model, hw, policy)
    assert r.ram_bytes % (64 * GiB) == 0
    assert r.result.summary.fits and r.below is not None and not r.below.summary.fits
    # independently: with that RAM it fits, with 64 GiB less it does not
    assert _fits(model, make_hardware("h100-pcie", r.ram_bytes), policy)
    assert not _fits(model, make_hardware("h100-pcie", r.ram_bytes - 64 * GiB), policy)
    assert sum(r.breakdown.values()) == r.host_bytes
    assert r.tokens_per_s > 0


def test_min_ram_of_a_small_model_is_one_step():
    r = min_ram(model_preset("tiny"), make_hardware("h100-pcie"), Policy(seq=128))
    assert r.ram_bytes == 64 * GiB and r.below is None


def test_min_ram_says_when_the_device_is_the_limit():
    policy = Policy(batch=64, seq=4096, act_ckpt_on="device")
    with pytest.raises(HorizonError, match="no amount of host RAM"):
        min_ram(model_preset("llama-3.1-8b"), make_hardware("rtx-4090"), policy)


def test_min_ram_rejects_k_larger_than_layers():
    with pytest.raises(HorizonError, match="act_ckpt_every"):
        min_ram(model_preset("tiny"), make_hardware("h100-pcie"), Policy(act_ckpt_every=9))


def test_round_up_ram():
    assert round_up_ram(1) == 64 * GiB
    assert round_up_ram(64 * GiB) == 64 * GiB
    assert round_up_ram(64 * GiB + 1) == 128 * GiB


# ---- max-model ----------------------------------------------------------------------------
def test_max_model_fits_and_the_next_bigger_does_not():
    hw = make_hardware("h100-pcie", "128GiB")
    base = Policy(seq=512)
    res = max_model(hw, base=base, workers=1)
    best = res.best
    assert best.fits and res.params == best.candidate.params == res.model.total_params
    assert _fits(res.model, hw, best.policy)
    nb = res.next_bigger
    assert nb is not None and nb.candidate.params > res.params
    for p in policy_set("lean", base).values():  # under no policy of the set
        assert not _fits(nb.candidate.model, hw, p)
    # nothing between them was skipped: nb is the next candidate up
    sizes = [c.params for c in candidates(hw, policy_set("lean", base))]
    assert sizes[sizes.index(res.params) + 1] == nb.candidate.params
    lp = res.largest_preset
    assert lp is not None and lp.candidate.family == "preset" and lp.fits
    assert (res.table.params >= res.params).sum() >= 2


def test_max_model_default_policy_set_is_no_bigger_than_lean():
    hw = make_hardware("rtx-4090", "64GiB")
    lean = max_model(hw, base=Policy(seq=256), workers=1)
    default = max_model(hw, base=Policy(seq=256), policies="default", workers=1)
    assert default.params <= lean.params
    assert default.best.policy_name == "default"


def test_max_model_families_and_bounds():
    hw = make_hardware("h200", "1.5TB")
    pols = policy_set("lean")
    cands = candidates(hw, pols)
    fams = {c.family for c in cands}
    assert fams == {"preset", "depth", "width"}
    assert [c.params for c in cands] == sorted(c.params for c in cands)
    assert any(c.model.name == "dense-120b-L100" for c in cands)
    # the lower bound never exceeds the simulated footprint
    m = model_preset("llama-3.1-8b")
    for p in pols.values():
        out = simulate_outcome(m, hw, p)
        assert host_lower_bound(m, p, hw) <= out.host_bytes
    assert set(POLICY_SETS["lean"]) >= {"default", "leanest"}
    with pytest.raises(HorizonError, match="did you mean"):
        policy_set("leen")


def test_max_model_nothing_fits():
    with pytest.raises(HorizonError, match="no candidate"):
        max_model(make_hardware("rtx-3090", "9GiB"), base=Policy(seq=128), workers=1)


# ---- sweep --------------------------------------------------------------------------------
GRID = {"models": ["tiny", "qwen2.5-0.5b"], "gpus": "h100-pcie", "ram": ["13GiB", "64GiB"],
        "policy": {"batch": [2, 4], "seq": 256, "optimizer": ["pipelined", "backward"]}}


def test_sweep_rows_files_and_errors(tmp_path):
    grid = parse_grid(GRID)
    df = sweep(grid, workers=2)
    assert len(df) == len(grid) == 2 * 1 * 2 * (2 * 2)
    bad = df[df.error != ""]
    assert len(bad) == 2 * 2 * 2  # optimizer backward with the default clip 1.0
    assert not bad.fits.any() and bad.error.str.contains("clip").all()
    good = df[df.error == ""]
    assert (good.tokens_per_s > 0).all() and good.params.gt(0).all()
    # RAM decides fits, nothing else
    for _, g in good.groupby(["model", "batch"]):
        assert g.tokens_per_s.nunique() == 1
    assert df[(df.model == "qwen2.5-0.5b") & (df.ram_bytes == 13 * GiB)].fits.sum() == 0
    assert df[(df.model == "tiny") & (df.error == "")].fits.all()
    out = write_results(df, tmp_path / "r.csv")
    back = pd.read_csv(out)
    assert len(back) == len(df) and {"model", "params", "gpu", "ram_bytes", "batch", "act_ckpt_every", "fits",
                                     "step_time_s", "tokens_per_s", "mfu", "device_peak_bytes",
                                     "host_bytes", "bottleneck", "error"} <= set(back.columns)
    png = feasibility_map(df, tmp_path / "r.png")
    assert png.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("data, match", [
    ({**GRID, "modles": ["tiny"]}, "did you mean 'models'"),
    ({**GRID, "policy": {"bacth": [1]}}, "did you mean 'batch'"),
    ({k: v for k, v in GRID.items() if k != "ram"}, "required key 'ram'"),
    ({**GRID, "models": []}, "empty"),
    ({**GRID, "models": ["llama-3.1-7b"]}, "did you mean"),
    ({**GRID, "gpus": ["h100"]}, "unknown gpu"),
    ({**GRID, "ram": ["12 potatoes"]}, "not a size"),
    ({**GRID, "ram": [0]}, "greater than zero"),
    ({**GRID, "policy": [1, 2]}, "policy must be a table"),
])
def test_grid_errors_are_one_line(data, match):
    with pytest.raises(HorizonError, match=match) as e:
        parse_grid(data, "grid.toml")
    assert "\n" not in str(e.value)


def test_invalid_policy_values_become_error_rows():
    grid = parse_grid({"models": "tiny", "gpus": "h100-pcie", "ram": "64GiB",
                       "policy": {"act_ckpt_every": [1, 100], "seq": 128, "batch": [0]}})
    df = sweep(grid, workers=1)
    assert len(df) == 2 and (df.error != "").all()
    grid = parse_grid({"models": "tiny", "gpus": "h100-pcie", "ram": "64GiB",
                       "policy": {"act_ckpt_every": [1, 100], "seq": 128}})
    df = sweep(grid, workers=1)
    assert df.error.tolist()[0] == "" and "act_ckpt_every=100" in df.error.tolist()[1]


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path):
    try:
        import pyarrow  # noqa: F401
        pytest.skip("pyarrow is installed")
    except ImportError:
        pass
    with pytest.raises(HorizonError, match="pyarrow.*csv"):
        write_results(pd.DataFrame(), tmp_path / "r.parquet")


def test_runner_caches_across_ram_sizes():
    m, p = model_preset("tiny"), Policy(seq=128)
    with Runner(workers=1) as r:
        a, b = r.run([(m, make_hardware("h100-pcie", "16GiB"), p), (m, make_hardware("h100-pcie", "1TB"), p)])
        assert a is b and len(r.cache) == 1


def test_runner_runs_a_peer_by_its_name_and_refuses_an_unknown_one():
    m, hw, p = model_preset("tiny"), make_hardware("h100-pcie"), Policy(seq=128)
    with Runner(workers=1) as r:
        for bad in ("zero3", "", True):
            with pytest.raises(HorizonError, match=r"^unknown peer .*; allowed: zero3-offload, zero2-offload$"):
                r.run([(m, hw, p), (m, hw, p, bad)])
        assert not r.cache  # refused before anything was simulated
        ours, peer, again = r.run([(m, hw, p), (m, hw, p, "zero3-offload"), (m, hw, p, None)])
        assert ours is again and peer.ok and peer.device_peak_bytes != ours.device_peak_bytes


def test_outcome_of_a_bad_policy_is_an_error():
    o = simulate_outcome(model_preset("tiny"), make_hardware("h100-pcie"), Policy(act_ckpt_every=9))
    assert not o.ok and "act_ckpt_every" in o.error and math.isnan(o.tokens_per_s)
    assert not o.fits(make_hardware("h100-pcie"))


# ---- advice -------------------------------------------------------------------------------
def test_advice_when_host_is_short():
    model, hw = model_preset("llama-3.1-8b"), make_hardware("h100-pcie", "128GiB")
    r = plan(model, hw, Policy(seq=512, master_dtype="fp32"))  # the whole master: short (the split fits)
    assert not r.summary.fits
    lines = advise(r, workers=1)
    assert lines[0].startswith("host RAM is short by") and "192 GiB" in lines[0]
    assert any(line.startswith("nearest policy that fits") for line in lines)


def test_nearest_fit_really_fits_and_is_one_change_away():
    model, hw = model_preset("llama-3.1-8b"), make_hardware("h100-pcie", "128GiB")
    with Runner(workers=1) as runner:
        nf = nearest_fit(model, hw, Policy(seq=512, master_dtype="fp32"), runner=runner)
    assert nf is not None and len(nf.changes) == 1
    assert _fits(model, hw, nf.policy)
    assert policy_flags(nf.policy, Policy(seq=512, master_dtype="fp32"))


def test_nearest_fit_keeps_the_training_as_it_is_when_it_can():
    # 8B on 128 GiB: bf16 moments alone fit and run faster than no working copy alone (the
    # link then carries fp32), but they change the training; of the lossless changes the split
    # master (the same bytes as no working copy, with the bf16 link kept) is the faster
    import dataclasses
    from horizon_sim.plan.advice import LOSSY
    model, hw, base = model_preset("llama-3.1-8b"), make_hardware("h100-pcie", "128GiB"), Policy(seq=512, master_dtype="fp32")
    lossy = plan(model, hw, dataclasses.replace(base, states_dtype="bf16")).summary
    no_copy = plan(model, hw, dataclasses.replace(base, working_copy=False)).summary
    split = plan(model, hw, dataclasses.replace(base, split_master=True)).summary
    assert lossy.fits and no_copy.fits and split.fits and lossy.tokens_per_s > no_copy.tokens_per_s
    assert split.tokens_per_s > no_copy.tokens_per_s
    assert split.host_bytes <= no_copy.host_bytes
    with Runner(workers=1) as runner:
        nf = nearest_fit(model, hw, base, runner=runner)
    assert nf.changes == ("split master",) and not set(nf.changes) & LOSSY


def test_advice_when_device_is_short():
    model, hw = model_preset("llama-3.1-8b"), make_hardware("rtx-4090", "512GiB")
    r = plan(model, hw, Policy(batch=16, seq=4096, act_ckpt_on="device"))
    lines = advise(r, workers=1)
    assert lines[0].startswith("device memory is short by")
    nearest = [line for line in lines if line.startswith("nearest policy that fits")]
    assert nearest and "--" in nearest[0]


def test_advice_when_it_fits_names_what_moves_the_step():
    # qwen2.5-0.5b at batch 4 x 512 on an H100 PCIe: a small step whose compute is mostly the
    # measured per-op fixed costs (specs/measured_kernels.py), so the CPU optimizer limits it and
    # the hardware change that moves it is a faster host Adam (before those costs were measured,
    # copies limited it and the advice named a faster link).
    r = plan(model_preset("qwen2.5-0.5b"), make_hardware("h100-pcie", "64GiB"), Policy(seq=512))
    lines = advise(r, workers=1)
    assert lines and all(isinstance(s, str) and "\n" not in s for s in lines)
    assert any("bigger batch" in s for s in lines)
    assert r.summary.bottleneck == "cpu optimizer"
    assert any("AdamW rate" in s and "cut the step by" in s for s in lines)
    # on a PCIe 4.0 A100 (no measured kernel tables) the same step still has copies a faster link shortens
    r4 = plan(model_preset("qwen2.5-0.5b"), make_hardware("a100-80gb", "64GiB"), Policy(seq=512))
    assert any("pcie-gen5" in s and "cut the step by" in s for s in advise(r4, workers=1))
    assert advise(r, search=False) == []


def test_advice_names_the_layer_order_where_micro_batches_reload_the_weights():
    """Micro-batches in the micro order load every unit once per micro-batch; where the link
    limits the step, the advice prices the layer order and says what it costs on the device."""
    pol = Policy(batch=8, seq=512, micro_batches=4)
    r = plan(model_preset("llama-3.1-8b"), make_hardware("rtx-4090", "1TB"), pol)
    lines = [s for s in advise(r, workers=1) if "--mb-order layer" in s]
    import dataclasses
    layer = plan(model_preset("llama-3.1-8b"), make_hardware("rtx-4090", "1TB"), dataclasses.replace(pol, mb_order="layer"))
    assert layer.summary.step_time_s < r.summary.step_time_s * (1 - MIN_GAIN)
    assert len(lines) == 1 and "cut the step by" in lines[0] and "more device memory" in lines[0]
    assert not any("--mb-order" in s for s in advise(layer, workers=1))  # already the layer order
