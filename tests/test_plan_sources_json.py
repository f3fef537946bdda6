"""Issue 43, item 8b: `horizon plan --sources --json` prints the presets' numbers and their
sources as one JSON object (it printed the text listing, which no JSON reader can take)."""
import json

from horizon_sim.cli.main import main


def test_plan_sources_json_is_the_sources_as_json(capsys):
    assert main(["plan", "--gpu", "gh200", "--sources", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {k: v["name"] for k, v in out.items()} == {"device": "gh200", "link": "nvlink-c2c", "host": "grace"}
    adam = out["host"]["numbers"]["adam_Gparams_per_s"]
    assert adam["value"] == 10.4 and adam["source"].startswith("published: DeepSpeed's CPU Adam")
    assert out["device"]["numbers"]["matmul_efficiency"]["source"].startswith("estimate:")
    gemm = out["device"]["numbers"]["gemm_TFLOPs"]["value"]   # a table: its rows
    assert gemm and all(isinstance(row, list) for row in gemm)


def test_plan_sources_text_and_json_list_the_same_numbers(capsys):
    assert main(["plan", "--sources"]) == 0
    text = capsys.readouterr().out
    assert main(["plan", "--sources", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for kind, part in out.items():
        assert f"{kind} {part['name']}" in text
        for field, n in part["numbers"].items():
            shown = f"{len(n['value'])} rows" if isinstance(n["value"], list) else f"{n['value']:g}"
            assert f"  {field} = {shown}: {n['source'] or 'no source'}" in text
