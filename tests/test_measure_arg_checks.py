"""Issue 30: calibrate and validate check every argument before measuring anything: values that
would run for days (--rounds 1000000, --peer-threads 100000, --steps 10**6), a --configs that
names nothing, and a --disk-dir that is missing or a file were refused (or not) only after
seconds of measuring. Each is now exit 2 with one line, at once."""

import pytest

from horizon_sim.cli.main import main

CASES = [
    (["calibrate", "--rounds", "1000000"], "--rounds 1000000 must be <= 100"),
    (["calibrate", "--rounds", "0"], "--rounds 0 must be >= 1"),
    (["calibrate", "--disk-dir", "/nonexistent"], "'/nonexistent' does not exist"),
    (["calibrate", "--disk-dir", "AFILE"], "is not a folder"),
    (["calibrate", "--batch", "0"], "--batch 0 must be >= 1"),
    (["validate", "--configs", ",,,"], "--configs ',,,' names no configuration"),
    (["validate", "--configs", ""], "--configs '' names no configuration"),
    (["validate", "--steps", "1000000"], "--steps 1000000 must be <= 1000"),
    (["validate", "--warmup", "101"], "--warmup 101 must be <= 100"),
    (["validate", "--peer", "zero3-offload", "--peer-threads", "100000"], "--peer-threads 100000 must be <= "),
]


@pytest.mark.parametrize("argv,says", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_refused_before_measuring(tmp_path, capsys, monkeypatch, argv, says):
    def measuring(*a, **k):  # the measuring code is loaded through this, after the checks
        raise AssertionError("measured before refusing")
    for cmd in ("calibrate_cmd", "validate_cmd"):
        monkeypatch.setattr(f"horizon_exec.cli.{cmd}.import_executor", measuring)
    (tmp_path / "AFILE").write_text("x")
    argv = [str(tmp_path / a) if a == "AFILE" else a for a in argv]
    out = ["-o", str(tmp_path / "hw.toml")] if argv[0] == "calibrate" else ["--out", str(tmp_path / "r")]
    assert main(argv + out) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_disk_store_says_a_file_is_not_a_folder(tmp_path):
    from horizon_exec.runtime.disk_store import DiskStore
    from horizon_sim.errors import HorizonError
    (tmp_path / "afile").write_text("x")
    with pytest.raises(HorizonError, match="'.*afile' is not a folder"):
        DiskStore({"a": 4096}, tmp_path / "afile")
