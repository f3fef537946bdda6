"""Issue 43 item 6: every JSON and TOML file a user names is parsed by one reader
(horizon_sim/safe_read.py). An integer past Python's 4300-digit conversion limit, arrays nested
100,000 deep, bytes that are not UTF-8 or a lone surrogate are one line naming the file (the
CLI: exit 2, no traceback), in config.json (--model), tokenizer_config.json (--tokenizer), a
--hardware TOML, a sweep grid, a safetensors index, a --published measurements file and a
schedule JSON, as they already were in JSONL data (tests/test_data_bad_json.py). A last test
keeps the class fixed: no other module parses JSON or TOML except the internal readers it
lists, each with its reason."""
import ast
from pathlib import Path

import pytest

from horizon_sim.cli.main import main
from horizon_sim.errors import HorizonError

ROOT = Path(__file__).resolve().parents[1]
DEEP = 100_000
JSON_BAD = {
    "digits_5000": ('{"x": ' + "9" * 5000 + "}").encode(),
    "nested_100000": ('{"x": ' + "[" * DEEP + "]" * DEEP + "}").encode(),
    "invalid_utf8": b'{"x": "caf\xe9"}',
    "lone_surrogate": b'{"x": "bad \\ud800"}',
}
TOML_BAD = {
    "digits_5000": ("x = " + "9" * 5000 + "\n").encode(),
    "nested_100000": ("x = " + "[" * DEEP + "]" * DEEP + "\n").encode(),
    "invalid_utf8": b'x = "caf\xe9"\n',
}
SAYS = {"digits_5000": "4300 digits", "nested_100000": "nested", "invalid_utf8": "not UTF-8",
        "lone_surrogate": "lone surrogate"}


def _tokenizer_folder(folder: Path) -> Path:
    """A WordLevel tokenizer.json (fast to build) whose tokenizer_config.json is the bad file."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    t = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "<eos>": 2, "<unk>": 3}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir()
    t.save(str(folder / "tokenizer.json"))
    return folder


def _model_config(tmp, bad):
    (tmp / "config.json").write_bytes(bad)
    return tmp / "config.json", ["plan", "--model", str(tmp / "config.json")]


def _train_model_config(tmp, bad):
    (tmp / "config.json").write_bytes(bad)
    return tmp / "config.json", ["train", "--model", str(tmp / "config.json"), "--steps", "1", "--no-progress"]


def _tokenizer_config(tmp, bad):
    d = _tokenizer_folder(tmp / "tok")
    (d / "tokenizer_config.json").write_bytes(bad)
    return d / "tokenizer_config.json", ["train", "--model", "tiny", "--tokenizer", str(d), "--steps", "1",
                                         "--batch", "1", "--seq", "16", "--eval-batches", "0", "--no-progress"]


def _hardware(tmp, bad):
    (tmp / "hw.toml").write_bytes(bad)
    return tmp / "hw.toml", ["plan", "--model", "tiny", "--hardware", str(tmp / "hw.toml")]


def _sweep_grid(tmp, bad):
    (tmp / "grid.toml").write_bytes(bad)
    return tmp / "grid.toml", ["sweep", str(tmp / "grid.toml"), "-o", str(tmp / "r.csv"), "--quiet"]


CLI_READERS = {"model_config": (_model_config, JSON_BAD), "train_model_config": (_train_model_config, JSON_BAD),
               "tokenizer_config": (_tokenizer_config, JSON_BAD), "hardware_toml": (_hardware, TOML_BAD),
               "sweep_grid": (_sweep_grid, TOML_BAD)}


@pytest.mark.parametrize("reader, bad", [(r, b) for r, (_, bads) in CLI_READERS.items() for b in bads])
def test_cli_reader_refuses_in_one_line_naming_the_file(tmp_path, capsys, reader, bad):
    make, bads = CLI_READERS[reader]
    path, argv = make(tmp_path, bads[bad])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(path) in err and SAYS[bad] in err, err


def _safetensors_index(tmp, bad):
    from horizon_exec.checkpoints.hf_checkpoint import weight_files
    (tmp / "model.safetensors.index.json").write_bytes(bad)
    return tmp / "model.safetensors.index.json", lambda: weight_files(tmp)


def _published(tmp, bad):
    from horizon_sim.published import load_rows
    (tmp / "rows.toml").write_bytes(bad)
    return tmp / "rows.toml", lambda: load_rows(tmp / "rows.toml")


LOADERS = {"safetensors_index": (_safetensors_index, JSON_BAD), "published_rows": (_published, TOML_BAD)}


@pytest.mark.parametrize("reader, bad", [(r, b) for r, (_, bads) in LOADERS.items() for b in bads])
def test_loader_refuses_in_one_line_naming_the_file(tmp_path, reader, bad):
    make, bads = LOADERS[reader]
    path, load = make(tmp_path, bads[bad])
    with pytest.raises(HorizonError) as e:
        load()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(path)) and SAYS[bad] in msg, msg


@pytest.mark.parametrize("bad", sorted(JSON_BAD))
def test_tokenizer_json_is_read_by_tokenizers_which_refuses_them(tmp_path, bad):
    """tokenizer.json is parsed by the `tokenizers` library (serde_json: a recursion limit of
    128, no integer past 64 bits, strict UTF-8 and escapes): an exception, never a crash, which
    HFTokenizer turns into one line naming the file. Kept here so a library upgrade that
    changed this would show."""
    from horizon_exec.data.tokenize import HFTokenizer
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json").write_bytes(JSON_BAD[bad])
    with pytest.raises(HorizonError) as e:
        HFTokenizer(d)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(d / "tokenizer.json")), msg


@pytest.mark.parametrize("bad", sorted(JSON_BAD))
def test_schedule_json_refuses_with_a_schedule_error(bad):
    from horizon_sim.schedule.check import ScheduleError
    from horizon_sim.schedule.serialize import from_json
    with pytest.raises(ScheduleError, match="malformed") as e:
        from_json(JSON_BAD[bad].decode("utf-8", errors="surrogateescape"))
    assert "\n" not in str(e.value)


# ---- the reader itself -------------------------------------------------------------------------------
def test_messages_give_line_and_column(tmp_path):
    from horizon_sim.safe_read import loads_json, read_json, read_toml
    p = tmp_path / "c.json"
    p.write_text('{\n  "a": 1,\n  "b": \n}\n')
    with pytest.raises(HorizonError, match=rf"^{p}: not valid JSON: Expecting value \(at line 4, column 1\)$"):
        read_json(p)
    p.write_bytes(b'{\n  "a": "\xff"\n}\n')
    with pytest.raises(HorizonError, match=rf"^{p}: not UTF-8 text \(at line 2, column 9: byte 0xff\)$"):
        read_json(p)
    p.write_text('{\n  "a": ' + "7" * 5000 + "\n}\n")
    with pytest.raises(HorizonError, match=rf"^{p}: an integer of 5000 digits; allowed: up to 4300 digits"):
        read_json(p)
    t = tmp_path / "c.toml"
    t.write_text("a = 1\nb = = 2\n")
    with pytest.raises(HorizonError, match=rf"^{t}: not valid TOML: Invalid value \(at line 2, column 5\)$"):
        read_toml(t)
    with pytest.raises(HorizonError, match=r"^f.jsonl:7: not valid JSON: Expecting value \(at column 7\)$"):
        loads_json('{"a": }\n', "f.jsonl:7")  # one line of text: its column only


def test_nesting_is_bounded_below_the_recursion_limit(tmp_path):
    """What Python could parse (a few hundred levels) but nothing downstream should walk is
    refused at the same bound as `tokenizers` (serde_json's 128); real files nest a few levels."""
    from horizon_sim.safe_read import MAX_NESTING, loads_json, read_toml
    ok = "[" * MAX_NESTING + "]" * MAX_NESTING
    assert loads_json(ok, "x") is not None
    with pytest.raises(HorizonError, match=rf"^x: nested too deeply \(more than {MAX_NESTING} levels"):
        loads_json("[" + ok + "]", "x")
    with pytest.raises(HorizonError, match=rf"^x: nested too deeply \(more than {MAX_NESTING} levels"):
        loads_json('{"a": ' * (MAX_NESTING + 1) + "1" + "}" * (MAX_NESTING + 1), "x")
    t = tmp_path / "t.toml"
    t.write_text("a = " + "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1) + "\n")
    with pytest.raises(HorizonError, match=rf"nested too deeply \(more than {MAX_NESTING} levels"):
        read_toml(t)


def test_good_files_read(tmp_path):
    from horizon_sim.safe_read import read_json, read_toml
    (tmp_path / "a.json").write_text('{"a": [1, 2.5, "é \\ud83d\\ude00"], "b": {"c": null}}')
    assert read_json(tmp_path / "a.json") == {"a": [1, 2.5, "é \U0001F600"], "b": {"c": None}}
    (tmp_path / "a.toml").write_text('a = 1\n[t]\nb = "x"\n')
    assert read_toml(tmp_path / "a.toml") == {"a": 1, "t": {"b": "x"}}


def test_unreadable_paths_are_one_line(tmp_path):
    import os
    from horizon_sim.safe_read import read_json
    with pytest.raises(HorizonError, match=rf"^{tmp_path / 'none.json'}: cannot read \(No such file"):
        read_json(tmp_path / "none.json")
    os.mkfifo(tmp_path / "fifo.json")  # opening it would block forever
    with pytest.raises(HorizonError, match="FIFO"):
        read_json(tmp_path / "fifo.json")


# ---- the class stays fixed ---------------------------------------------------------------------------
PARSERS = {("json", "load"), ("json", "loads"), ("tomllib", "load"), ("tomllib", "loads"),
           ("json", "JSONDecoder"), ("json", "raw_decode")}
ALLOWED = {
    # (file, function): why it may parse JSON/TOML itself
    ("horizon_sim/safe_read.py", "loads_json"): "the safe reader",
    ("horizon_sim/safe_read.py", "loads_toml"): "the safe reader",
    ("horizon_sim/specs/measured_kernels.py", "_load"): "a TOML file shipped inside the package",
    ("horizon_exec/checkpoints/ckpt.py", "_generation"): "trainer.json of a checkpoint: catches ValueError and "
        "RecursionError itself, damage is a CheckpointError so resume falls back to the previous checkpoint",
    ("horizon_exec/checkpoints/ckpt.py", "_state_header"): "a checkpoint's own state header, as above",
    ("horizon_exec/checkpoints/ckpt.py", "_read_meta_bytes"): "a checkpoint's trainer.json, as above",
    ("horizon_exec/cli/train_cmd.py", "<module>"): "the launcher's arguments to its ranks, in an environment "
        "variable Horizon wrote",
    ("horizon_exec/measure/child.py", "run_json_child"): "a measuring child's result line, written by Horizon",
    ("horizon_exec/measure/ranks.py", "measure_ranks"): "a rank's result file, written by Horizon",
    ("horizon_exec/measure/ranks.py", "_rank_main"): "the job in an environment variable Horizon wrote",
    ("horizon_exec/measure/peer_deepspeed.py", "<module>"): "the job on stdin, written by Horizon",
    ("horizon_exec/measure/probe.py", "_recv"): "the probe child's result lines, written by Horizon",
    ("horizon_exec/measure/probe.py", "_child"): "the probe request's hardware (a checked HardwareSpec that "
        "hardware_to_toml wrote) and its step commands on a pipe, written by Horizon",
    ("horizon_exec/measure/probe.py", "<module>"): "the probe request on stdin, written by Horizon",
}


def _parse_calls(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every JSON/TOML parse call or import of a parser in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node, func):
        for child in ast.iter_child_nodes(node):
            f = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name) \
                    and (child.value.id, child.attr) in PARSERS:
                found.append((func, child.lineno))
            elif isinstance(child, ast.Attribute) and child.attr == "raw_decode":
                found.append((func, child.lineno))
            elif isinstance(child, ast.ImportFrom) and child.module in ("json", "tomllib", "tomli") \
                    and any((child.module.replace("tomli", "tomllib"), a.name) in PARSERS | {("json", "decoder")}
                            for a in child.names):
                found.append((func, child.lineno))
            elif isinstance(child, ast.Import) and any(a.name in ("json", "tomllib") and a.asname for a in child.names):
                found.append((func, child.lineno))  # an alias would hide the calls from this test
            visit(child, f)
    visit(tree, "<module>")
    return found


def test_no_json_or_toml_parsed_outside_the_safe_reader():
    seen, stray = set(), []
    for pkg in ("horizon_sim", "horizon_exec"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for func, line in _parse_calls(path):
                if (rel, func) in ALLOWED:
                    seen.add((rel, func))
                else:
                    stray.append(f"{rel}:{line} in {func}")
    assert not stray, ("JSON/TOML parsed outside horizon_sim/safe_read.py (use read_json/read_toml/loads_json; "
                       f"or add an internal reader to ALLOWED with its reason): {stray}")
    assert seen == set(ALLOWED), f"ALLOWED lists readers that are gone: {sorted(set(ALLOWED) - seen)}"
