"""Issue 19 item 4: absurd sizes are refused up front with a one-line error naming the value and
the allowed range, or cost work that does not grow with them; no planner verb or train
admission hangs or exhausts memory on them."""
import json
import signal
from dataclasses import replace

import pytest

from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError
from horizon_sim.plan.max_model import candidates, policy_set
from horizon_sim.plan.grid import MAX_SWEEP_SIMULATIONS, parse_grid
from horizon_sim.plan.runner import Runner
from horizon_sim.plan.sweep import check_map
from horizon_sim.schedule import build_schedule, builder, work
from horizon_sim.schedule.limits import MAX_LAYER_PASSES, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH
from horizon_sim.schedule.op import OpKind
from horizon_sim.sim.costs import CostModel
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.model_presets import model_preset
from horizon_sim.specs.policy import MAX_BATCH, MAX_SEQ, MAX_SLOTS, Policy

TINY = model_preset("tiny")


@pytest.fixture
def no_hang():
    """Turn a hang into a failure (SIGALRM) instead of stalling the suite; it bounds nothing a
    passing run gets near (the refusals below take milliseconds)."""
    def alarm(signum, frame):
        raise TimeoutError("still working after 60 s: the input was not refused up front")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 60)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def no_build(monkeypatch):
    """Any schedule actually built fails loudly: the refusal must come first."""
    def boom(self):
        raise AssertionError("the schedule was built before the size was refused")
    monkeypatch.setattr(builder.TrainStepBuilder, "build", boom)


def _one_line_error(capsys, argv, *words):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    line = err.splitlines()[-1]
    assert line.startswith(f"horizon {argv[0]}: error: ") and "Traceback" not in err, err
    for w in words:
        assert w in line, (w, line)
    return line


# ---- the head's loss chunks: one cost entry per shape, however many chunks ----------------
def test_head_gemms_do_not_grow_with_the_tokens():
    few = work.head_gemms(TINY, 10_000, 1024)        # 9 full chunks and one of 784 tokens
    many = work.head_gemms(TINY, 2**40, 1024)        # 2^30 chunks
    assert len(few) == 6 and len(many) == 3
    assert [g.count for g in few] == [9, 9, 9, 1, 1, 1] and {g.count for g in many} == {2**30}
    # the FLOPs are those of every chunk
    assert sum(g.flops for g in few) == pytest.approx(3 * 2.0 * 10_000 * TINY.vocab * TINY.hidden)


def test_the_head_costs_what_its_chunks_cost_one_by_one():
    """The count changes how the chunks are listed, not what they cost: the GEMM term equals
    the sum over chunks, each looked up in the measured table at its own shape."""
    hw = make_hardware("h100-pcie")
    gemm_rows = [["bf16", lay, m, n, k, 100.0 + m / 64 + n / 4096 + k / 1024]
                 for lay in ("nt", "nn", "tn") for m in (128, 1024) for n in (256, 4096) for k in (256, 4096)]
    hw = replace(hw, device=replace(hw.device, gemm_TFLOPs=tuple(map(tuple, gemm_rows))))
    pol = Policy(batch=3, seq=1000, loss_chunk_tokens=1024)  # 3000 tokens: 2 chunks of 1024 and one of 952
    sched = build_schedule(TINY, pol)
    costs = CostModel(hw, "bf16", sched.meta)
    head = next(op for op in sched.ops if op.kind == OpKind.HEAD)
    one_by_one = 0.0
    for start in range(0, 3000, 1024):
        n = min(1024, 3000 - start)
        for g in (work.Gemm("nt", n, TINY.vocab, TINY.hidden), work.Gemm("nn", n, TINY.hidden, TINY.vocab),
                  work.Gemm("tn", TINY.vocab, TINY.hidden, n)):
            one_by_one += g.flops / (costs.gemm.rate(g.layout, (g.m, g.n, g.k)) * 1e12)
    assert costs.compute_terms(head)["gemm"] == pytest.approx(one_by_one, rel=1e-12)


# ---- bounds, each named with its range ----------------------------------------------------
@pytest.mark.parametrize("field,value,limit", [("batch", 10**12, MAX_BATCH), ("seq", 10**8, MAX_SEQ),
                                               ("slots", 10**5, MAX_SLOTS)])
def test_policy_sizes_beyond_the_bounds_are_refused(field, value, limit):
    with pytest.raises(HorizonError, match=rf"policy {field}={value} .*allowed: \d+\.\.{limit:,}$"):
        Policy(**{field: value})
    Policy(**{field: limit})  # the bound itself is taken


@pytest.mark.parametrize("clip", [float("nan"), float("inf"), True])
def test_a_non_finite_clip_is_refused(clip):
    with pytest.raises(HorizonError, match="grad_clip=.* must be a finite number >= 0"):
        Policy(grad_clip=clip)


@pytest.mark.parametrize("change,what", [
    (dict(n_layers=10**5), f"model n_layers=100000 is beyond .*allowed: 1..{MAX_LAYERS}$"),
    (dict(hidden=2**21, n_heads=2**14, n_kv_heads=2**14), f"model hidden=2097152 .*allowed: 1..{MAX_WIDTH:,}$"),
    (dict(ffn_hidden=10**7), "model ffn_hidden=10000000 "),
    (dict(head_dim=2**18), r"model q_dim \(n_heads x head_dim\)=2097152 "),
    (dict(vocab=2**25), f"model vocab=33554432 .*allowed: 1..{MAX_VOCAB:,}$"),
])
def test_model_sizes_beyond_the_bounds_are_refused_before_building(no_build, change, what):
    with pytest.raises(HorizonError, match=what):
        build_schedule(replace(TINY, **change), Policy(seq=128))


def test_micro_batches_times_layers_is_bounded(no_build):
    most = MAX_LAYER_PASSES // (TINY.n_layers + 1)
    with pytest.raises(HorizonError, match=rf"micro_batches={most + 1} with 8 layers .* micro_batches <= {most} "):
        build_schedule(TINY, Policy(batch=most + 1, micro_batches=most + 1, seq=16))


def test_max_model_depth_family_stops_at_the_layer_bound():
    hw = make_hardware("h200", "100000TB")  # room for far more layers than any model has
    depth = [c.model.n_layers for c in candidates(hw, policy_set("lean")) if c.family == "depth"]
    assert max(depth) == MAX_LAYERS


# ---- the sweep grid and the search runner -------------------------------------------------
def test_a_grid_needing_too_many_simulations_is_refused_before_simulating():
    big = {"models": "tiny", "gpus": ["h100-pcie", "h200"], "ram": "64GiB",
           "policy": {"batch": list(range(1, 101)), "act_ckpt_every": list(range(1, 9)), "slots": [2, 3, 4, 5, 6, 7, 8]}}
    with pytest.raises(HorizonError, match=rf"the grid needs 11,200 simulations .*up to {MAX_SWEEP_SIMULATIONS:,}"):
        parse_grid(big)


def test_the_feasibility_map_is_bounded():
    rams = [f"{64 * (i + 1)}GiB" for i in range(65)]
    with pytest.raises(HorizonError, match="at most 64 RAM sizes; the grid has 65: use --no-plot"):
        check_map(parse_grid({"models": "tiny", "gpus": "h100-pcie", "ram": rams}))
    check_map(parse_grid({"models": "tiny", "gpus": "h100-pcie", "ram": rams[:64]}))


def test_absurd_worker_counts_are_refused():
    with pytest.raises(HorizonError, match=r"workers=1000000: this machine has \d+ cores; allowed: 1\.\."):
        Runner(workers=10**6)


# ---- every verb, from the command line ------------------------------------------------------
@pytest.fixture
def deep_config(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 10**5, "hidden_size": 256,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
                             "vocab_size": 1024}))
    return str(p)


@pytest.mark.parametrize("verb", ["plan", "simulate", "tune", "min-ram"])
def test_every_verb_refuses_a_huge_layer_count_in_one_line(capsys, no_hang, no_build, deep_config, verb):
    _one_line_error(capsys, [verb, "--model", deep_config], "n_layers=100000", f"allowed: 1..{MAX_LAYERS}")


@pytest.mark.parametrize("verb", ["plan", "simulate", "min-ram", "max-model"])
def test_every_verb_refuses_a_huge_batch_in_one_line(capsys, no_hang, verb):
    argv = [verb] + ([] if verb == "max-model" else ["--model", "tiny"]) + ["--batch", str(10**12)]
    _one_line_error(capsys, argv, "batch=1000000000000", f"allowed: 1..{MAX_BATCH:,}")


@pytest.mark.parametrize("verb", ["plan", "tune", "max-model"])
def test_every_verb_refuses_a_huge_seq_in_one_line(capsys, no_hang, verb):
    argv = [verb] + ([] if verb == "max-model" else ["--model", "tiny"]) + ["--seq", str(10**8)]
    _one_line_error(capsys, argv, "seq=100000000", f"allowed: 1..{MAX_SEQ:,}")


def test_sweep_refuses_a_huge_model_and_grid_in_one_line(capsys, no_hang, tmp_path, deep_config):
    grid = tmp_path / "grid.toml"
    # among valid rows, an invalid one is an error row and the sweep succeeds; alone, it fails (issue 30)
    grid.write_text(f'models = ["tiny", "{deep_config}"]\ngpus = "h100-pcie"\nram = "64GiB"\n')
    rc = main(["sweep", str(grid), "-o", str(tmp_path / "r.csv"), "--quiet", "--workers", "1", "--no-plot"])
    assert rc == 0 and "n_layers=100000 is beyond" in (tmp_path / "r.csv").read_text()  # an error row
    grid.write_text(f'models = ["{deep_config}"]\ngpus = "h100-pcie"\nram = "64GiB"\n')
    _one_line_error(capsys, ["sweep", str(grid), "-o", str(tmp_path / "r.csv"), "--workers", "1", "--no-plot"],
                    "every configuration of", "is invalid (1 row(s)", "n_layers=100000 is beyond")
    grid.write_text('models = "tiny"\ngpus = "h100-pcie"\nram = "64GiB"\n'
                    f'[policy]\nbatch = {list(range(1, 10_002))}\n')
    _one_line_error(capsys, ["sweep", str(grid), "-o", str(tmp_path / "r.csv")], "10,001 simulations")


@pytest.mark.parametrize("argv,words", [
    (["--batch", str(10**12)], ["batch=1000000000000", f"allowed: 1..{MAX_BATCH:,}"]),
    (["--micro-batches", "10000", "--batch", "10000"], ["micro_batches=10000", "micro_batches <= 3640"]),
])
def test_train_admission_refuses_absurd_sizes_before_anything(capsys, no_hang, argv, words):
    _one_line_error(capsys, ["train", "--model", "tiny", "--steps", "1", *argv], *words)


def test_train_refuses_a_huge_layer_count(capsys, no_hang, no_build, deep_config):
    _one_line_error(capsys, ["train", "--model", deep_config, "--steps", "1"], "n_layers=100000")
