"""The reports/ builder on its reduced (--quick) configuration: every file the README links to
exists, the figures are real PNGs, the tables have one row per configuration, and the build
leaves other commands' files alone while removing its own stale ones."""
import json
import re

import pandas as pd
import pytest

from horizon_sim.report import build as B

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CFG = B.QUICK


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    (out / "validation_llama.csv").write_text("from horizon validate\n")  # another command's file
    (out / "old_plot.png").write_bytes(PNG_MAGIC)  # a file an earlier build wrote, no longer built
    (out / B.MANIFEST).write_text("old_plot.png\nREADME.md\n")
    # one process: the suite already keeps the cores busy, and worker processes would add their
    # start-up (measured alone: 27.6 CPU-s with 2 workers, 19.6 with 1)
    res = B.build(out, quick=True, workers=1)
    return out, res


def _links(readme: str) -> list[str]:
    """Relative targets of markdown links and images (no URLs, no #anchors)."""
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t and not t.startswith("#")]


def test_readme_links_point_at_files_that_exist(built):
    out, res = built
    readme = (out / "README.md").read_text()
    links = _links(readme)
    assert links and all((out / t).is_file() for t in links), [t for t in links if not (out / t).is_file()]
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert set(images) == {"headline_overlap.png", "optimizer_modes.png", "ckpt_memory.png",
                           f"feasibility_{CFG.map_gpu}.png", "scale_out.png", "peer_compare.png", "published.png"}
    for f in res["files"]:  # everything written is linked from the README (or is the README)
        assert f == "README.md" or f in links, f
    assert "make reports" in readme and "estimate" in readme
    assert "## Predicted vs measured" in readme and "horizon validate" in readme


def test_planner_sections_are_numbered_in_order(built):
    """Every section the planner builds is numbered 1..N in the order shown, the table of contents
    links each by its numbered anchor; the two framing sections are not numbered."""
    out, _ = built
    readme = (out / "README.md").read_text()
    heads = re.findall(r"^## (.+)$", readme, flags=re.M)
    assert heads[0] == "What is estimated" and heads[-1] == "Predicted vs measured"
    numbers = [int(re.match(r"(\d+)\. ", h).group(1)) for h in heads[1:-1]]
    assert numbers == list(range(1, 14)), heads
    assert "(#7-against-deepspeed-zero-3-offload-planned)" in readme


def test_pngs_are_real_images(built):
    out, res = built
    pngs = [f for f in res["files"] if f.endswith(".png")]
    assert len(pngs) == 7
    for f in pngs:
        data = (out / f).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, f


def test_tables_have_one_row_per_configuration(built):
    out, _ = built
    fit = pd.read_csv(out / "fit_table.csv")
    n = len(CFG.table_models) * len(CFG.table_gpus) * len(CFG.table_rams)
    assert len(fit) == 2 * n
    assert (fit.policy.value_counts() == n).all() and set(fit.policy) == {"default", "tuned"}
    assert fit[fit.fits].tokens_per_s.gt(0).all() and fit[~fit.fits].tokens_per_s.isna().all()
    # where both fit, the tuned policy is never slower than the default it started from
    both = fit.pivot_table(index=["model", "gpu", "ram"], columns="policy", values="tokens_per_s").dropna()
    assert (both.tuned >= both.default * (1 - 1e-9)).all()
    md = (out / "fit_table.md").read_text().strip().splitlines()
    assert len(md) == 2 + 2 * n

    modes = pd.read_csv(out / "optimizer_modes.csv")
    assert list(modes["mode"]) == list(B.MODES)
    assert modes.set_index("mode").grad_clip["backward"] == 0

    ck = pd.read_csv(out / "ckpt_placement.csv")
    assert len(ck) == 2 * len(CFG.ckpt_models) and set(ck.act_ckpt_on) == {"device", "host"}

    for tag in ("default", "lean"):
        f = pd.read_csv(out / f"feasibility_{CFG.map_gpu}_{tag}.csv")
        assert len(f) == len(CFG.map_models) * len(CFG.map_rams)
    assert len((out / "feasibility.md").read_text().strip().splitlines()) == 2 + len(CFG.map_rams)


def test_headline_numbers_and_trace(built):
    out, res = built
    h = json.loads((out / "headline.json").read_text())
    assert h["default"]["fits"] is False  # the quick config is chosen not to fit, like the real one
    assert h["default"]["min_ram_bytes"] > 0
    assert "nearest_fit" in h or "tuned" in h
    assert h["shown"]["step_time_s"] > 0
    trace = json.loads((out / "headline_trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    readme = (out / "README.md").read_text()
    assert "does not fit" in readme


def test_build_keeps_foreign_files_and_drops_its_stale_ones(built):
    out, res = built
    assert (out / "validation_llama.csv").read_text() == "from horizon validate\n"
    assert "validation_llama.csv" not in res["files"]
    assert "(validation_llama.csv)" in (out / "README.md").read_text()  # listed under Predicted vs measured
    assert not (out / "old_plot.png").exists()
    manifest = (out / B.MANIFEST).read_text().split()
    assert sorted(manifest) == sorted(res["files"]) and "README.md" in manifest


def test_small_output(built):
    out, res = built
    assert sum((out / f).stat().st_size for f in res["files"]) < 5 * 2**20


def test_help_explains_the_command(capsys):
    with pytest.raises(SystemExit) as e:
        B.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--out" in text and "--quick" in text and "reports" in text


def test_scale_out_section_is_planned_data_parallel(built):
    _, res = built
    rows = res["scale_out"].data["rows"]
    assert {(r["devices_per_node"], r["nodes"]) for r in rows} == {(CFG.scale_gpus_per_node, n) for n in CFG.scale_nodes} \
        | {(g, 1) for g in CFG.scale_devices}
    by_nodes = sorted((r for r in rows if r["sweep"] == "nodes"), key=lambda r: r["nodes"])
    # more nodes: less host RAM per node (master and moments are split), more tokens/s
    assert all(a["host_bytes"] > b["host_bytes"] for a, b in zip(by_nodes, by_nodes[1:]))
    assert all(a["tokens_per_s"] < b["tokens_per_s"] for a, b in zip(by_nodes, by_nodes[1:]))
    assert "Planned, not yet executed" in res["scale_out"].body


def test_peer_section_plans_both_on_every_platform_and_sweep(built):
    from horizon_sim.specs.hf_config import load_model
    out, res = built
    rows = res["peer"].data["rows"]
    assert len(rows) == (len(CFG.peer_platforms) * len(CFG.peer_models) + len(CFG.peer_depths)
                         + len(CFG.peer_widths))
    for r in rows:
        assert r["speedup"] == r["horizon_tokens_per_s"] / r["peer_tokens_per_s"]
    for r in (r for r in rows if r["sweep"] == "platforms"):  # 18 B/param of model states at least
        assert r["peer_host_bytes"] >= 18 * load_model(r["model"]).total_params
    depth = [r for r in rows if r["sweep"] == "depth"]
    assert [r["params_B"] for r in depth] == sorted(r["params_B"] for r in depth)
    assert "ZeRO-3" in res["peer"].body and (out / "peer_compare.csv").is_file()


def test_throughput_section_changes_one_thing_at_a_time(built):
    """Section 10: per case the micro order, the layer order, then kept layers; the layer order
    never moves more bytes over the link, kept layers fit the device and lower the share of
    recompute (HFU / MFU)."""
    out, _ = built
    t = pd.read_csv(out / "throughput.csv")
    assert set(t.case.str.split(" on ").str[0]) == {c[0] for c in CFG.throughput_cases}
    for _, g in t.groupby("case", sort=False):
        g = g.reset_index(drop=True)
        assert list(g.mb_order[:2]) == ["micro", "layer"] and (g.kept_layers[:2] == 0).all()
        assert g.link_GB_per_step[1] <= g.link_GB_per_step[0] * (1 + 1e-9)
        if len(g) == 3:
            assert g.kept_layers[2] > 0 and g.device_fits[2]
            assert g.hfu[2] / g.mfu[2] < g.hfu[1] / g.mfu[1]


def test_moe_section_prices_active_and_total(built):
    """Section 11: an MoE case's active parameters are far fewer than its total, and the RAM to
    buy (min-ram) covers the planned host footprint."""
    out, _ = built
    t = pd.read_csv(out / "moe.csv")
    assert list(t.model) == [c[0] for c in CFG.moe_cases]
    assert (t.active_B < t.total_B / 4).all()
    assert (t.ram_needed_GiB >= t.host_GiB).all() and t.tokens_per_s.gt(0).all()


def test_adapters_section_sets_lora_against_full_fine_tuning(built):
    """Section 12: on each machine LoRA adapts a model at least as large as full fine-tuning
    trains (its host store is about 2 bytes a parameter, not 12-16; under 1 with an nf4 base,
    which adapts one at least as large again), and the two are compared on full fine-tuning's
    largest model."""
    out, _ = built
    t = pd.read_csv(out / "adapters.csv")
    bases = len(CFG.adapters_bases)
    assert [(g, r) for g, r in zip(t.gpu, t.ram)] == [m for m in CFG.adapters_machines for _ in range(bases)]
    assert list(t.base) == ["bf16", "nf4"] * len(CFG.adapters_machines)
    from horizon_sim.specs.hardware_presets import make_hardware
    runtime = [make_hardware(g, r).host.runtime_overhead_GiB for g, r in zip(t.gpu, t.ram)]
    per = (t.lora_host_GiB - runtime) * 2**30 / (t.lora_B * 1e9)  # the base, checkpoints, staging
    assert (t.lora_B >= 3 * t.full_B).all()
    assert (per[t.base == "bf16"] < 2.5).all() and (per[t.base == "nf4"] < 1.0).all()
    bf16, nf4 = t[t.base == "bf16"].reset_index(), t[t.base == "nf4"].reset_index()
    assert (nf4.lora_B >= bf16.lora_B).all()  # a 4-bit base: at least as large a model on each machine
    assert t.same_lora_tokens_per_s.gt(0).all() and t.full_tokens_per_s.gt(0).all()


def test_frontier_section_sets_each_machine_beside_the_peer(built):
    """Section 13: per box the default policy, its nearest fit when it does not fit, and the peer;
    the nodes' rows need less RAM per node the more nodes share the master and moments, the
    disk-tier row puts its moments on the drive; RAM to buy covers the planned footprint."""
    out, _ = built
    t = pd.read_csv(out / "frontier.csv")
    name, _, _, _, nodes, _ = CFG.frontier_nodes
    rows = t[t.model == name]
    horizon = rows[rows.system == "Horizon"]
    assert len(horizon) == len(nodes) and horizon.ram_needed_TiB.is_monotonic_decreasing
    assert (horizon.ram_needed_TiB >= horizon.host_TiB).all()
    disk = rows[rows.system == "Horizon (disk tier)"]
    assert len(disk) == 1 and disk.disk_TiB.iloc[0] > 0
    assert (t.system == "ZeRO-3 offload").sum() == len(CFG.frontier_boxes) + 1
    assert t.tokens_per_s.gt(0).all()
    lora = t[t.system.str.startswith("Horizon LoRA")]  # a frozen base: about 0.5-2 bytes a parameter of host RAM
    assert len(lora) == len(CFG.frontier_lora_boxes) and (lora.host_TiB * 2**40 < 2.5 * 21e9).all()
    assert lora["flags"].str.contains("--lora-targets all-linear,1.mlp.experts.gate_up_proj").all()
