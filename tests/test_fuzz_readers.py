"""Issue 19 item 12 and issue 30: every reader of user input, fuzzed with hypothesis: config.json,
JSONL and text data (lone surrogates, huge integers, deep nesting), chat records through a
chat template, the safetensors index, files and headers, tokenizer.json and
tokenizer_config.json, the local HF cache's refs, checkpoint metadata and the `latest`
pointer, sweep grids, hardware TOML (and its numbers' ranges), and the planner's
command-line flags. Each input either reads, or is
refused with a one-line HorizonError (the CLI: exit 2, one line, no traceback). A few dozen
examples per reader here; benchmarks/fuzz_readers.py runs thousands."""
import json
import os
import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from horizon_sim.errors import HorizonError
from tests.fuzz_strategies import AWKWARD_LINES, JSON, SCALARS, count, dumps, mutate, one_line_or_ok

EXAMPLES = int(os.environ.get("HORIZON_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128, "rms_norm_eps": 1e-6,
         "max_position_embeddings": 256, "tie_word_embeddings": False, "head_dim": 16,
         "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
QWEN2 = {**{k: v for k, v in LLAMA.items() if k not in ("rope_parameters", "head_dim")}, "model_type": "qwen2",
         "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1,
         "layer_types": ["full_attention", "sliding_attention"], "rope_theta": 1e6}


# ---- config.json ---------------------------------------------------------------------------------
@FUZZ
@given(data=st.data(), base=st.sampled_from([LLAMA, QWEN2]))
def test_config_json(tmp_path_factory, data, base):
    from horizon_sim.specs.hf_config import from_hf_config
    cfg = mutate(base, data, keys=[*base, "rope_scaling", "attention_bias", "mlp_bias", "layer_types",
                                   "partial_rotary_factor", "quantization_config", "model_type"])
    p = tmp_path_factory.mktemp("cfg") / "config.json"
    p.write_text(dumps(cfg))
    spec = one_line_or_ok(from_hf_config, p)
    if spec is not None:  # what was accepted is a model the executor can build
        assert spec.total_params > 0 and spec.hd > 0 and spec.hd % 2 == 0


@FUZZ
@given(text=st.text(max_size=200))
def test_config_json_any_text(tmp_path_factory, text):
    from horizon_sim.specs.hf_config import from_hf_config
    p = tmp_path_factory.mktemp("cfg") / "config.json"
    p.write_text(text)
    one_line_or_ok(from_hf_config, p)


# ---- data ----------------------------------------------------------------------------------------
RECORD_KEYS = ["text", "instruction", "response", "input", "messages", "tools"]


@FUZZ
@given(data=st.data())
def test_jsonl_data(tmp_path_factory, data):
    from horizon_exec.data.data import load_dataset
    from horizon_exec.data.tokenize import ByteTokenizer
    lines = []
    for _ in range(data.draw(st.integers(1, 4), label="records")):
        kind = data.draw(st.sampled_from(["json", "raw", "blank", "awkward"]), label="line kind")
        if kind == "json":
            base = data.draw(st.sampled_from([{"text": "hello world " * 3},
                                              {"instruction": "q", "response": "a" * 10},
                                              {"messages": [{"role": "user", "content": "hi"}]}]))
            lines.append(dumps(mutate(base, data, keys=RECORD_KEYS)))
        elif kind == "awkward":
            lines.append(data.draw(AWKWARD_LINES, label="awkward line"))
        elif kind == "raw":
            lines.append(data.draw(st.text(max_size=30), label="raw line").replace("\n", " "))
        else:
            lines.append("")
    p = tmp_path_factory.mktemp("data") / "d.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    one_line_or_ok(load_dataset, p, ByteTokenizer(), 8, 0.0)


@FUZZ
@given(raw=st.binary(max_size=300))
def test_text_data_any_bytes(tmp_path_factory, raw):
    from horizon_exec.data.data import load_dataset
    from horizon_exec.data.tokenize import ByteTokenizer
    for name in ("d.txt", "d.jsonl"):
        p = tmp_path_factory.mktemp("data") / name
        p.write_bytes(raw)
        one_line_or_ok(load_dataset, p, ByteTokenizer(), 4, 0.0)


# ---- safetensors index and files -----------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from tests.hf_tiny import tiny_hf
    d = tmp_path_factory.mktemp("hf")
    tiny_hf("llama").save_pretrained(d, max_shard_size="60KB")
    return d


@FUZZ
@given(data=st.data())
def test_safetensors_index(tmp_path_factory, hf_dir, data):
    import shutil

    from horizon_exec.checkpoints.hf_checkpoint import load_hf, spec_from_hf_dir
    from horizon_exec.runtime.config import AdmissionConfig, TrainerConfig
    from horizon_exec.runtime.trainer import Trainer
    from horizon_sim.specs.policy import exact_policy
    d = tmp_path_factory.mktemp("ckpt")
    for f in hf_dir.iterdir():
        shutil.copy(f, d / f.name)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    how = data.draw(st.sampled_from(["index", "weight_map", "shard"]), label="damage")
    if how == "index":
        (d / "model.safetensors.index.json").write_text(dumps(mutate(idx, data)))
    elif how == "weight_map":
        wm = idx["weight_map"]
        name = data.draw(st.sampled_from(sorted(wm)), label="tensor")
        wm[name] = data.draw(st.one_of(SCALARS, st.sampled_from(["../config.json", "/etc/passwd", "x.safetensors",
                                                                 "model.safetensors.index.json"])), label="file")
        (d / "model.safetensors.index.json").write_text(dumps(idx))
    else:
        shard = d / data.draw(st.sampled_from(sorted(set(idx["weight_map"].values()))), label="shard")
        raw = bytearray(shard.read_bytes())
        cut = data.draw(st.integers(0, min(len(raw), 400)), label="cut")
        raw = raw[:cut] if data.draw(st.booleans(), label="truncate") else raw[:8] + bytes(data.draw(
            st.binary(min_size=1, max_size=64), label="header")) + raw[8 + 64:]
        shard.write_bytes(bytes(raw))

    def load():
        cfg = TrainerConfig(admission=AdmissionConfig(enabled=False), random_init=False)
        with Trainer(spec_from_hf_dir(d), exact_policy(batch=1, seq=8), cfg) as tr:
            load_hf(tr, d)
    one_line_or_ok(load)


# ---- tokenizer -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok_json(tmp_path_factory):
    from tests.hf_tokenizers import tokenizer_folder
    d = tokenizer_folder(tmp_path_factory.mktemp("tok"), bos=True)
    return json.loads((d / "tokenizer.json").read_text()), json.loads((d / "tokenizer_config.json").read_text())


@FUZZ
@given(data=st.data())
def test_tokenizer_files(tmp_path_factory, tok_json, data):
    from horizon_exec.data.tokenize import HFTokenizer
    tok, cfg = tok_json
    d = tmp_path_factory.mktemp("tok")
    which = data.draw(st.sampled_from(["tokenizer", "config", "text"]), label="damage")
    (d / "tokenizer.json").write_text(dumps(mutate(tok, data)) if which == "tokenizer" else
                                      data.draw(st.text(max_size=80)) if which == "text" else json.dumps(tok))
    (d / "tokenizer_config.json").write_text(dumps(mutate(cfg, data, keys=[*cfg, "eos_token", "bos_token"]))
                                             if which == "config" else json.dumps(cfg))
    t = one_line_or_ok(HFTokenizer, d)
    if t is not None:
        one_line_or_ok(t.encode, ["hello world"], counted=False)


# ---- sweep grid and hardware TOML --------------------------------------------------------------------
GRID = {"models": ["tiny"], "gpus": ["h100-pcie"], "ram": ["64GiB"], "links": ["pcie-gen5"],
        "policy": {"batch": [1, 2], "act_ckpt_every": [1]}}


@FUZZ
@given(data=st.data())
def test_sweep_grid(data):
    from horizon_sim.plan.grid import parse_grid
    grid = mutate(GRID, data, keys=[*GRID, "hosts"])
    if isinstance(grid.get("policy"), dict) and data.draw(st.booleans(), label="damage policy"):
        grid["policy"] = mutate(grid["policy"], data, keys=["batch", "seq", "act_ckpt_every", "optimizer", "slots"])
    one_line_or_ok(parse_grid, grid)


@FUZZ
@given(text=st.text(max_size=120))
def test_sweep_grid_any_toml(tmp_path_factory, text):
    from horizon_sim.plan.grid import load_grid
    p = tmp_path_factory.mktemp("grid") / "g.toml"
    p.write_text(text)
    one_line_or_ok(load_grid, p)


@pytest.fixture(scope="module")
def hw_toml(tmp_path_factory):
    from horizon_sim.specs.hardware_io import save_hardware
    from horizon_sim.specs.hardware_presets import make_hardware
    p = tmp_path_factory.mktemp("hw") / "hw.toml"
    save_hardware(make_hardware("h100-pcie"), p)
    return tomllib.loads(p.read_text())


def _toml(d: dict) -> str:
    from horizon_sim.specs.hardware_io import toml_value
    out = []
    for k, v in d.items():
        if not isinstance(v, dict):
            out.append(f"{json.dumps(str(k))} = {toml_value(v)}")
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(f"[{json.dumps(str(k))}]")
            out += [f"{json.dumps(str(kk))} = {toml_value(vv)}" for kk, vv in v.items() if not isinstance(vv, dict)]
    return "\n".join(out) + "\n"


TOML_VALUES = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(), st.text(max_size=8),
                        st.lists(st.one_of(st.floats(), st.text(max_size=4), st.integers(-9, 9)), max_size=3),
                        st.lists(st.lists(st.one_of(st.floats(), st.text(max_size=4)), max_size=6), max_size=2))


@FUZZ
@given(data=st.data())
def test_hardware_toml(tmp_path_factory, hw_toml, data):
    from horizon_sim.specs.hardware_io import load_hardware
    d = json.loads(json.dumps(hw_toml))
    part = data.draw(st.sampled_from(["device", "link", "host"]), label="table")
    keys = sorted(d[part]) + ["gemm_TFLOPs", "op_overhead_us", "attention_TFLOPs", "bogus"]
    for k in data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True), label="keys"):
        d[part][k] = data.draw(TOML_VALUES, label=k)
    p = tmp_path_factory.mktemp("hw") / "hw.toml"
    try:
        p.write_text(_toml(d))
    except (ValueError, OverflowError):
        return  # a value TOML cannot hold
    hw = one_line_or_ok(load_hardware, p)
    if hw is not None:  # what was accepted simulates
        from horizon_sim.plan import plan
        from horizon_sim.specs.policy import Policy
        one_line_or_ok(plan, "tiny", hw, Policy(batch=1, seq=64), counted=False)


# any number, tiny to huge, of either sign, in any numeric field: in range it plans, out of
# range it is refused by name (issue 30: hbm_GiB = 1e300 overflowed the planner)
MAGNITUDES = st.one_of(st.builds(lambda m, e: m * 10.0 ** e, st.floats(-9.99, 9.99), st.integers(-320, 308)),
                       st.integers(-2**70, 2**70), st.sampled_from([0, 0.0, -0.0, 1e308, 5e-324, 2**63, 2**64]))


@FUZZ
@given(data=st.data())
def test_hardware_ranges(tmp_path_factory, hw_toml, data):
    from horizon_sim.specs.hardware_io import load_hardware
    d = json.loads(json.dumps(hw_toml))
    for _ in range(data.draw(st.integers(1, 3), label="fields")):
        part = data.draw(st.sampled_from(["device", "link", "host"]), label="table")
        nums = sorted(k for k, v in d[part].items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        d[part][data.draw(st.sampled_from(nums), label="key")] = data.draw(MAGNITUDES, label="value")
    if data.draw(st.booleans(), label="a table row"):
        d["device"]["gemm_TFLOPs"] = [["bf16", "nt", *(data.draw(MAGNITUDES, label="cell") for _ in range(4))]]
    p = tmp_path_factory.mktemp("hw") / "hw.toml"
    try:
        p.write_text(_toml(d))
    except (ValueError, OverflowError, HorizonError):
        return  # a value TOML cannot hold
    hw = one_line_or_ok(load_hardware, p)
    if hw is not None:
        from horizon_sim.plan import plan
        from horizon_sim.specs.policy import Policy
        one_line_or_ok(plan, "tiny", hw, Policy(batch=1, seq=64), counted=False)


# ---- chat records through a chat template ---------------------------------------------------------
@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    from horizon_exec.data.tokenize import HFTokenizer
    from tests.hf_tokenizers import tokenizer_folder
    return HFTokenizer(tokenizer_folder(tmp_path_factory.mktemp("chat")))


MESSAGE = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "assistant", "system", "tool"]), SCALARS),
                                 "content": st.one_of(st.text(max_size=20), JSON)})


@FUZZ
@given(data=st.data())
def test_chat_records(tmp_path_factory, chat_tok, data):
    from horizon_exec.data.data import load_dataset
    base = {"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello " * 4}]}
    rec = mutate(base, data, keys=["messages", "tools"])
    if data.draw(st.booleans(), label="fuzz the messages"):
        rec["messages"] = data.draw(st.lists(st.one_of(MESSAGE, JSON), max_size=4), label="messages")
    line = dumps(rec)
    p = tmp_path_factory.mktemp("chat") / "d.jsonl"
    p.write_text(line + "\n" + dumps(base) + "\n", encoding="utf-8", errors="surrogatepass")
    one_line_or_ok(load_dataset, p, chat_tok, 4, 0.0)


# ---- the local Hugging Face cache -----------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_hf_cache_refs(tmp_path_factory, data):
    from horizon_sim.specs.hf_cache import resolve_model_dir
    hub = tmp_path_factory.mktemp("hub")
    root = hub / "models--org--m"
    (root / "refs").mkdir(parents=True)
    (root / "snapshots" / "abc123").mkdir(parents=True)
    (root / "snapshots" / "abc123" / "config.json").write_text("{}")
    ref = root / "refs" / "main"
    how = data.draw(st.sampled_from(["good", "bytes", "text", "folder", "fifo", "none"]), label="refs/main")
    if how == "good":
        ref.write_text("abc123\n")
    elif how == "bytes":
        ref.write_bytes(data.draw(st.binary(max_size=300), label="raw"))
    elif how == "text":
        ref.write_text(data.draw(st.text(max_size=60), label="text"), encoding="utf-8", errors="surrogatepass")
    elif how == "folder":
        ref.mkdir()
    elif how == "fifo":
        os.mkfifo(ref)
    rev = data.draw(st.one_of(st.just(""), st.just("@abc123"), st.from_regex(r"@[A-Za-z0-9._/-]{1,20}", fullmatch=True)),
                    label="rev")
    old = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(hub)
    try:
        one_line_or_ok(resolve_model_dir, "org/m" + rev)
    finally:
        if old is None:
            del os.environ["HF_HUB_CACHE"]
        else:
            os.environ["HF_HUB_CACHE"] = old


# ---- checkpoint metadata and the latest pointer ------------------------------------------------------
def _meta() -> dict:
    from horizon_exec.checkpoints.ckpt import FORMAT
    return {"format": FORMAT, "step": 2, "generation": 2, "model": {"name": "m", "n_layers": 1},
            "policy": {"batch": 1}, "trainer": {"pending": False, "steps_done": 2, "lr": 1e-3, "pending_lr": 0.0},
            "optimizer": {}, "loop": {"epoch": 0, "pos": 1, "seed": 0}}


@FUZZ
@given(data=st.data())
def test_ckpt_meta_and_pointer(tmp_path_factory, data):
    from horizon_exec.checkpoints.ckpt import candidates, read_meta, read_pointer
    root = tmp_path_factory.mktemp("ck")
    step = root / "step-2"
    step.mkdir()
    which = data.draw(st.sampled_from(["meta", "meta_bytes", "pointer"]), label="damage")
    META = _meta()
    if which == "meta":
        meta = mutate(META, data, keys=[*META, "version", "data"])
        if isinstance(meta.get("trainer"), dict) and data.draw(st.booleans(), label="damage trainer"):
            meta["trainer"] = mutate(meta["trainer"], data, keys=[*META["trainer"], "skipped_steps"])
        (step / "trainer.json").write_text(dumps(meta))
    elif which == "meta_bytes":
        (step / "trainer.json").write_bytes(data.draw(st.one_of(st.binary(max_size=200), AWKWARD_LINES.map(str.encode)),
                                                      label="raw"))
    else:
        (step / "trainer.json").write_text(json.dumps(META))
        if data.draw(st.booleans(), label="fifo"):
            os.mkfifo(root / "latest")
        else:
            (root / "latest").write_bytes(data.draw(st.one_of(st.binary(max_size=60), st.sampled_from(
                [b"step-2\n", b"step-2", b"step-3\n", b"../../etc\n", b"step-2\x00"])), label="latest"))
    if which == "pointer":
        name, why = read_pointer(root)
        assert (name is None or not why) and "\n" not in why, (name, why)
        count("refused" if why else "accepted")
        assert candidates(root)
    else:
        one_line_or_ok(read_meta, step)


# ---- the planner's flags -------------------------------------------------------------------------------
FLAG_VALUES = st.sampled_from(["0", "-1", "1", "3", "1e30", "nan", "inf", "-inf", "2.5", "", "x", "99999999999999999999",
                               "1TB", "0GiB", "-5GiB", "host", "device", "bf16", "fp64", "h200", "nope", "\x00"])
FLAGS = ["--batch", "--seq", "--micro-batches", "--act-ckpt-every", "--slots", "--act-ckpt-on", "--optimizer",
         "--grad-clip", "--compute-dtype", "--states-dtype", "--grad-dtype", "--gpu", "--ram", "--link",
         "--doc-tokens", "--model"]


@FUZZ
@given(verb=st.sampled_from(["plan", "simulate", "tune", "min-ram", "max-model"]),
       flags=st.lists(st.tuples(st.sampled_from(FLAGS), FLAG_VALUES), max_size=3))
def test_planner_flags(capsys, verb, flags):
    from horizon_sim.cli.main import main
    argv = [verb]
    if verb != "max-model" and not any(f == "--model" for f, _ in flags):
        argv += ["--model", "tiny"]
    if verb == "tune":
        argv += ["--max-batch", "2"]
    for f, v in flags:
        if verb == "max-model" and f == "--model":
            continue
        argv += [f, v]
    try:
        rc = main(argv + ["--json"] if verb != "simulate" else argv)
    except SystemExit as e:  # argparse's own refusal: exit 2 and a usage line
        rc = e.code
    err = capsys.readouterr().err
    count("accepted" if rc == 0 else "refused" if rc == 2 else "other")
    assert rc in (0, 2), (argv, rc, err)
    assert "Traceback" not in err, err
    if rc == 2:
        assert err.strip().splitlines()[-1].startswith(("horizon ", "usage:")) or "error:" in err, err


# ---- what fuzzing found accepted silently: each refused by name now ---------------------------------
@pytest.mark.parametrize("key,row,says", [
    ("gemm_TFLOPs", '["bf16", "zz", 512.0, 512.0, 512.0, 0.21]', "layout='zz'"),
    ("gemm_TFLOPs", '["fp8x", "nt", 512.0, 512.0, 512.0, 0.21]', "dtype='fp8x'"),
    ("gemm_TFLOPs", '["bf16", "nt", 0.5, 512.0, 512.0, 0.21]', "M=0.5"),
    ("op_overhead_us", '["forwardz", 12.0]', "kind='forwardz'"),
    ("attention_TFLOPs", '["bf16", 512.0, 0.5, 1.0, 1.0]', "HEAD_DIM=0.5"),
])
def test_hardware_table_keys_outside_their_values_are_refused(tmp_path, key, row, says):
    from horizon_sim.specs.hardware_io import load_hardware, save_hardware
    from horizon_sim.specs.hardware_presets import make_hardware
    p = tmp_path / "hw.toml"
    save_hardware(make_hardware("a100-80gb"), p)  # a preset without measured tables: each is `key = []`
    p.write_text(p.read_text().replace(f"{key} = []", f"{key} = [{row}]"))
    with pytest.raises(HorizonError, match=says):
        load_hardware(p)


@pytest.mark.parametrize("over,says", [
    ({"head_dim": 15}, "head_dim=15 .* must be even"),
    ({"hidden_size": 62, "num_attention_heads": 2}, "head_dim=31"),
])
def test_a_head_dim_rope_cannot_rotate_is_refused(over, says):
    from horizon_sim.specs.hf_config import spec_from_config_dict
    base = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 96, "vocab_size": 128}
    with pytest.raises(HorizonError, match=says):
        spec_from_config_dict({**base, **over})


# ---- the planner's outputs ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["plan", "--model", "tiny", "--json"], ["plan", "--model", "tiny"],
                                  ["min-ram", "--model", "tiny", "--gpu", "h100-pcie", "--json"]])
def test_output_to_a_full_device_is_one_line(argv):
    import subprocess
    import sys
    from pathlib import Path
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "horizon_sim.cli.main", *argv], stdout=full,
                           stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == f"horizon {argv[0]}: error: cannot write the output: No space left on device"


@pytest.mark.parametrize("flag", ["--plot", "--trace"])
def test_simulate_files_to_a_full_device_are_one_line(capsys, flag):
    from horizon_sim.cli.main import main
    assert main(["simulate", "--model", "tiny", "--batch", "1", "--seq", "64", flag, "/dev/full"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "/dev/full" in err and "Traceback" not in err, err
