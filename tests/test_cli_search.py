"""`horizon tune | min-ram | max-model | sweep` end to end through configure/run, and every bad
input class as a one-line HorizonError (the main entry point turns it into exit code 2)."""
import argparse
import json

import pytest

from horizon_sim.cli import max_model_cmd, min_ram_cmd, sweep_cmd, tune_cmd
from horizon_sim.errors import HorizonError
from horizon_sim.plan import plan
from horizon_sim.specs.hardware_presets import make_hardware
from horizon_sim.specs.policy import Policy
from horizon_sim.units import GiB

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TUNE = ["--model", "tiny", "--gpu", "h100-pcie", "--ram", "64GiB", "--seq", "128", "--max-batch", "8",
        "--workers", "1", "--quiet"]
MAXM = ["--gpu", "rtx-4090", "--ram", "64GiB", "--seq", "128", "--workers", "1", "--quiet"]
MINR = ["--model", "llama-3.1-8b", "--gpu", "h100-pcie", "--seq", "512"]
GRID = """
models = ["tiny", "qwen2.5-0.5b"]
gpus = ["h100-pcie"]
ram = ["13GiB", "64GiB"]
[policy]
seq = [128]
batch = [2, 4]
act_ckpt_every = [1, 2]
"""


def _parse(mod, argv):
    p = argparse.ArgumentParser()
    mod.configure(p)
    return p.parse_args(argv)


def _run(mod, argv, capsys):
    rc = mod.run(_parse(mod, argv))
    return rc, capsys.readouterr().out


def _grid(tmp_path, text=GRID):
    g = tmp_path / "grid.toml"
    g.write_text(text)
    return str(g)


# ---- each verb end to end ------------------------------------------------------------------
def test_tune_text_and_json(capsys):
    rc, out = _run(tune_cmd, TUNE, capsys)
    assert rc == 0 and "configurations that fit" in out and "Pareto front" in out
    assert "horizon plan --model tiny" in out
    rc, out = _run(tune_cmd, TUNE + ["--json", "--top", "3"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["fits"] and len(d["top"]) <= 3 and d["pareto"]
    best = Policy(**d["best_policy"])
    hw = make_hardware("h100-pcie", "64GiB")
    s = plan("tiny", hw, best).summary
    assert s.fits and s.tokens_per_s >= d["baseline"]["tokens_per_s"]
    assert d["best"]["tokens_per_s"] == pytest.approx(s.tokens_per_s)


@pytest.mark.parametrize("args,hint", [
    (["--model", "llama-3.1-8b", "--ram", "32GiB"], "try --states-dtype bf16"),   # host RAM short
    (["--model", "llama-3.1-70b", "--ram", "64GiB", "--lora-rank", "8"], "try more --ram (horizon min-ram), --base-quant"),
    (["--model", "gpt-oss-120b", "--ram", "128GB", "--lora-rank", "8", "--base-quant", "nf4"],
     "try a smaller --batch or --seq, or a GPU with more memory")])  # a bf16 layer slot is 6.5 GB
def test_tune_nothing_fits_is_a_horizon_error_with_a_hint_that_applies(capsys, args, hint):
    """The hint names what would free what is short: no host-update flag for a frozen base, and
    the device's own fixes where the device is short."""
    with pytest.raises(HorizonError, match="nothing in the search space fits") as e:
        _run(tune_cmd, [*args, "--gpu", "rtx-4090", "--seq", "128", "--max-batch", "1", "--workers", "1", "--quiet"],
             capsys)
    assert hint in str(e.value)


def test_min_ram_text_and_json(capsys):
    rc, out = _run(min_ram_cmd, MINR, capsys)
    assert rc == 0 and "GiB of host RAM" in out and "moments" in out and "tokens/s" in out
    rc, out = _run(min_ram_cmd, MINR + ["--json"], capsys)
    d = json.loads(out)
    ram = d["ram_bytes"]
    assert rc == 0 and ram % (64 * GiB) == 0 and d["fits"] and not d["below_fits"]
    policy = Policy(seq=512)
    assert plan("llama-3.1-8b", make_hardware("h100-pcie", ram), policy).summary.fits
    assert not plan("llama-3.1-8b", make_hardware("h100-pcie", ram - 64 * GiB), policy).summary.fits
    assert sum(d["host_breakdown_bytes"].values()) == d["host_bytes"]


def test_max_model_text_and_json(capsys):
    rc, out = _run(max_model_cmd, MAXM, capsys)
    assert rc == 0 and out.startswith("max-model on rtx-4090") and "next bigger candidate" in out
    rc, out = _run(max_model_cmd, MAXM + ["--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["params"] > 1e8 and d["tokens_per_s"] > 0
    assert d["next_bigger"]["params"] > d["params"] and not d["next_bigger"]["fits"]
    hw = make_hardware("rtx-4090", "64GiB")
    from horizon_sim.specs.model import ModelSpec
    assert plan(ModelSpec(**d["shape"]), hw, Policy(**d["policy_fields"])).summary.fits


def test_sweep_writes_csv_and_png(tmp_path, capsys):
    out_csv = tmp_path / "res.csv"
    rc, out = _run(sweep_cmd, [_grid(tmp_path), "-o", str(out_csv), "--workers", "2", "--quiet"], capsys)
    assert rc == 0 and f"wrote {out_csv}" in out
    import pandas as pd
    df = pd.read_csv(out_csv)
    assert len(df) == 2 * 1 * 2 * 4
    assert (tmp_path / "res.png").read_bytes().startswith(PNG_MAGIC)
    rc, out = _run(sweep_cmd, [_grid(tmp_path), "-o", str(tmp_path / "b.csv"), "--workers", "1",
                               "--quiet", "--json", "--no-plot"], capsys)
    d = json.loads(out)
    assert d["rows"] == 16 and d["plot"] is None and not (tmp_path / "b.png").exists()


@pytest.mark.parametrize("mod", [tune_cmd, min_ram_cmd, max_model_cmd, sweep_cmd])
def test_help_has_an_example(mod, capsys):
    with pytest.raises(SystemExit) as e:
        _parse(mod, ["--help"])
    assert e.value.code == 0
    assert "example:" in capsys.readouterr().out


# ---- bad input, one line each ---------------------------------------------------------------
def _one_line_error(mod, argv, match, capsys):
    with pytest.raises(HorizonError, match=match) as e:
        _run(mod, argv, capsys)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("mod, argv, match", [
    (tune_cmd, ["--model", "lama-3.1-8b"], "unknown model 'lama-3.1-8b' \\(did you mean 'llama-3.1-8b'\\?\\)"),
    (min_ram_cmd, ["--model", "qwen2.5-7"], "did you mean"),
    (max_model_cmd, ["--gpu", "h10-pcie"], "unknown gpu.*did you mean 'h100-pcie'"),
    (tune_cmd, ["--model", "tiny", "--link", "pcie-gen9"], "unknown link"),
    (max_model_cmd, ["--ram", "0GiB"], "greater than zero"),
    (tune_cmd, ["--model", "tiny", "--ram=-5G"], "not a size"),
    (max_model_cmd, ["--ram", "12 potatoes"], "not a size"),
    (tune_cmd, ["--model", "tiny", "--seq", "0"], "--seq 0 must be a positive"),
    (tune_cmd, ["--model", "tiny", "--top", "-1"], "--top -1 must be a positive"),
    (tune_cmd, ["--model", "tiny", "--max-batch", "0"], "--max-batch 0"),
    (max_model_cmd, ["--batch", "0"], "--batch 0"),
    (max_model_cmd, ["--workers", "0"], "--workers 0"),
    (min_ram_cmd, ["--model", "tiny", "--act-ckpt-every", "9"], "act_ckpt_every=9 is larger than the model's 8 layers"),
    (min_ram_cmd, ["--model", "tiny", "--batch", "0"], "batch=0"),
    (min_ram_cmd, ["--model", "tiny", "--slots", "1"], "slots"),
])
def test_bad_input_is_one_line(mod, argv, match, capsys):
    _one_line_error(mod, argv, match, capsys)


@pytest.mark.parametrize("text, match", [
    (GRID.replace("models", "modles"), "unknown key 'modles' \\(did you mean 'models'\\?\\)"),
    (GRID.replace("act_ckpt_every", "ckpt_evry"), "unknown policy key 'ckpt_evry' \\(did you mean 'act_ckpt_every'\\?\\)"),
    ("models = [\"tiny\"\ngpus = 3", "not valid TOML"),
    (GRID.replace('ram = ["13GiB", "64GiB"]', 'ram = ["12 potatoes"]'), "not a size"),
    (GRID.replace('gpus = ["h100-pcie"]', 'gpus = ["h100-pcei"]'), "did you mean 'h100-pcie'"),
])
def test_bad_grid_file_is_one_line(text, match, tmp_path, capsys):
    _one_line_error(sweep_cmd, [_grid(tmp_path, text), "-o", str(tmp_path / "r.csv"), "--quiet"], match, capsys)
    assert not (tmp_path / "r.csv").exists()


def test_sweep_output_errors(tmp_path, capsys):
    g = _grid(tmp_path)
    _one_line_error(sweep_cmd, [g, "-o", str(tmp_path / "r.xlsx")], "must end in .csv or .parquet", capsys)
    _one_line_error(sweep_cmd, [g, "-o", str(tmp_path / "no" / "r.csv")], "does not exist", capsys)
    _one_line_error(sweep_cmd, [str(tmp_path / "missing.toml"), "-o", str(tmp_path / "r.csv")], "not found",
                    capsys)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        _one_line_error(sweep_cmd, [g, "-o", str(tmp_path / "r.parquet")], "pyarrow.*r.csv", capsys)


def test_non_numbers_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as e:
        _parse(tune_cmd, ["--seq", "many"])
    assert e.value.code == 2


def test_a_sweep_whose_every_row_is_invalid_fails(tmp_path, capsys):
    """Issue 30: a grid with no valid row is an error (the table is still written); with one valid
    row the invalid ones are error rows of a successful sweep (test_plan_absurd_sizes)."""
    text = GRID.replace("act_ckpt_every = [1, 2]", "act_ckpt_every = [99]").replace(
        'models = ["tiny", "qwen2.5-0.5b"]', 'models = ["tiny"]')
    _one_line_error(sweep_cmd, [_grid(tmp_path, text), "-o", str(tmp_path / "r.csv"), "--quiet", "--workers", "1"],
                    r"every configuration of .*grid.toml is invalid \(4 row\(s\), each with its error in .*r.csv\), "
                    r"e.g.: .*act_ckpt_every=99", capsys)
    assert (tmp_path / "r.csv").exists() and not (tmp_path / "r.png").exists()


@pytest.mark.parametrize("gpus,nodes", [(2, 2), (8, 8)])
def test_tunes_printed_command_plans_its_best_row_on_the_whole_cluster(capsys, gpus, nodes):
    """The 'plan it' command of a multi-node search keeps the layout (--gpus/--nodes) and the
    header names it: planned as printed, it gives the best row's figures exactly (issue 29's
    done-when: 8 GPUs x 8 nodes as well as the small case)."""
    import shlex

    from horizon_sim.cli import plan_cmd
    argv = ["--model", "qwen2.5-0.5b", "--gpu", "h200", "--ram", "128GiB", "--gpus", str(gpus), "--nodes", str(nodes),
            "--seq", "256", "--max-batch", "4", "--workers", "1", "--quiet"]
    rc, text = _run(tune_cmd, argv, capsys)
    assert rc == 0 and f" on {nodes} x {gpus} x h200 / " in text.splitlines()[0]
    rc, out = _run(tune_cmd, argv + ["--json"], capsys)
    d = json.loads(out)
    cmd = d["plan_command"]
    assert f"plan it:  {cmd}" in text and f"--gpus {gpus} --nodes {nodes}" in cmd
    words = shlex.split(cmd)
    assert words[:2] == ["horizon", "plan"]
    rc, out = _run(plan_cmd, words[2:] + ["--json", "--no-advice"], capsys)
    got = json.loads(out)
    assert got["ranks"] == gpus * nodes and got["fits"] == d["best"]["fits"] and got["fits"]
    assert got["tokens_per_s"] == pytest.approx(d["best"]["tokens_per_s"], rel=1e-9)
    assert got["host_bytes"] == d["best"]["host_bytes"]
