"""Issue 30: a FIFO where Horizon opens a file blocked forever (opening a FIFO waits for the
other end): `ck/latest`, `model.safetensors` in --init-from, --log-file, simulate --plot and
--trace, a data file. Each is now refused up front with one line (a FIFO `latest` is a damaged
pointer: resume falls back to the step folders), by stat, never by opening it. Character
devices stay accepted where they make sense: --log-file /dev/null, /dev/stderr, /dev/full."""
import contextlib
import os
import signal

import pytest

from horizon_sim.errors import HorizonError


@contextlib.contextmanager
def no_hang(seconds: int = 10):
    """Fail (instead of hanging the suite) if the body blocks, as opening a FIFO does."""
    def boom(*_):
        raise TimeoutError(f"blocked for {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _fifo(path):
    os.mkfifo(path)
    return path


def test_fifo_latest_is_a_damaged_pointer(tmp_path):
    from horizon_exec.checkpoints.ckpt import read_pointer
    _fifo(tmp_path / "latest")
    with no_hang():
        name, why = read_pointer(tmp_path)
    assert name is None and "FIFO" in why and str(tmp_path / "latest") in why


def test_fifo_weights_file_in_init_from(tmp_path):
    from horizon_exec.checkpoints.hf_checkpoint import weight_files
    _fifo(tmp_path / "model.safetensors")
    with no_hang(), pytest.raises(HorizonError, match="model.safetensors' is a FIFO"):
        weight_files(tmp_path)


def test_fifo_shard_named_by_the_index(tmp_path):
    from horizon_exec.checkpoints.hf_checkpoint import weight_files
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "s1.safetensors"}}')
    _fifo(tmp_path / "s1.safetensors")
    with no_hang(), pytest.raises(HorizonError, match="s1.safetensors' is a FIFO"):
        weight_files(tmp_path)


def test_fifo_log_file_is_refused(tmp_path):
    from horizon_exec.train.outputs import prepare_outputs
    _fifo(tmp_path / "log.jsonl")
    with no_hang(), pytest.raises(HorizonError, match="--log-file .* is a FIFO"):
        prepare_outputs(log_file=str(tmp_path / "log.jsonl"))


@pytest.mark.parametrize("dev", ["/dev/null", "/dev/full", "/dev/stderr"])
def test_character_devices_stay_accepted_as_log_file(dev):
    from horizon_exec.train.outputs import prepare_outputs
    if not os.path.exists(dev):
        pytest.skip(f"no {dev}")
    with no_hang():
        prepare_outputs(log_file=dev)


def test_fifo_data_file_is_refused(tmp_path):
    from horizon_exec.data.data import load_dataset
    from horizon_exec.data.tokenize import ByteTokenizer
    _fifo(tmp_path / "d.jsonl")
    with no_hang(), pytest.raises(HorizonError, match="data file .* is a FIFO"):
        load_dataset(tmp_path / "d.jsonl", ByteTokenizer(), 8)


@pytest.mark.parametrize("flag", ["--plot", "--trace"])
def test_fifo_simulate_outputs_are_refused_before_simulating(tmp_path, capsys, flag):
    from horizon_sim.cli.main import main
    out = _fifo(tmp_path / ("step.png" if flag == "--plot" else "step.json"))
    with no_hang():
        rc = main(["simulate", "--model", "tiny", "--batch", "1", "--seq", "64", flag, str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "is a FIFO" in err and str(out) in err and len(err.splitlines()) == 1, err


def test_write_atomic_refuses_a_socket(tmp_path):
    import socket

    from horizon_sim.safe_files import write_atomic
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(HorizonError, match="is a socket"):
            write_atomic(tmp_path / "sock", b"x", "plot")
    finally:
        s.close()
