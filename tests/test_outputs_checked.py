"""Issue 19, item 2: every output (--ckpt-dir, --save-hf, --log-file and their parents) is
checked before the first step: created when missing, of the right kind, writable, with room
for what the run writes. A refusal is one line, exit 2, and no step runs."""
import json
import re

import pytest

from horizon_sim.cli.main import main
from tests.train_run import MICRO, in_tmpfs, tmpfs_works

BASE = ["train", "--model", str(MICRO), "--steps", "1", "--batch", "2", "--seq", "32", "--no-progress",
        "--eval-batches", "0"]


def _refused(capsys, argv, *words):
    assert main(BASE + argv) == 2
    out, err = capsys.readouterr()
    assert "admission:" not in out and "final loss" not in out   # refused before anything was built
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


CASES = {
    # name: (argv given the tmp folder, words of the error)
    "save-hf folder holds other files": (lambda t: ["--save-hf", t / "notes"], ["--save-hf", "notes.txt"]),
    "save-hf under a file": (lambda t: ["--save-hf", t / "file" / "out"], ["is a file; give a folder"]),
    "save-hf is a file": (lambda t: ["--save-hf", t / "file"], ["exists and is not a folder"]),
    "save-hf is the init-from folder": (lambda t: ["--init-from", t / "hf", "--tokenizer", "bytes",
                                                   "--save-hf", t / "hf" / "."],
                                        ["would replace the --init-from folder"]),
    "save-hf would hold the ckpt-dir": (lambda t: ["--save-hf", t / "o", "--ckpt-dir", t / "o" / "ck"],
                                        ["would hold --ckpt-dir"]),
    "save-hf would hold the log": (lambda t: ["--save-hf", t / "o", "--log-file", t / "o" / "log"],
                                   ["would hold --log-file"]),
    "ckpt-dir is a file": (lambda t: ["--ckpt-dir", t / "file"], ["--ckpt-dir", "is a file"]),
    "ckpt-dir under a file": (lambda t: ["--ckpt-dir", t / "file" / "ck"],
                              ["cannot create the folder: a file where a folder is expected"]),
    "log-file is a folder": (lambda t: ["--log-file", t], ["--log-file", "is a folder; give a file"]),
    "log-file under a file": (lambda t: ["--log-file", t / "file" / "log"], ["--log-file", "is a file"]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_output_is_refused_before_the_first_step(tmp_path, capsys, case):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine\n")
    (tmp_path / "file").write_text("x\n")
    (tmp_path / "hf").mkdir()   # an --init-from folder: its config is read before the outputs are checked
    (tmp_path / "hf" / "config.json").write_text(MICRO.read_text())
    argv, words = CASES[case]
    _refused(capsys, [str(a) for a in argv(tmp_path)], *words)
    assert (tmp_path / "notes" / "notes.txt").read_text() == "mine\n"


def test_missing_parents_are_created(tmp_path, capsys):
    argv = ["--ckpt-dir", tmp_path / "a" / "b" / "ck", "--save-hf", tmp_path / "c" / "d" / "out",
            "--log-file", tmp_path / "e" / "f" / "log.jsonl"]
    assert main(BASE + [str(a) for a in argv]) == 0, capsys.readouterr().err
    assert (tmp_path / "a" / "b" / "ck" / "latest").is_file()
    assert (tmp_path / "c" / "d" / "out" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "e" / "f" / "log.jsonl").read_text().splitlines()[0])["step"] == 1


needs_tmpfs = pytest.mark.skipif(not tmpfs_works(), reason="needs a private tmpfs mount (root or user namespaces)")


@needs_tmpfs
def test_read_only_outputs_are_refused_up_front():
    """One tmpfs, remounted read-only; each output on it in turn."""
    r = in_tmpfs('for o in "--ckpt-dir $M/ck" "--save-hf $M/out" "--log-file $M/log"; do '
                 '$TRAIN --steps 1 $o; echo "rc=$?"; done', setup='mkdir "$M/ck"', read_only=True)
    assert r.stdout.count("rc=2") == 3 and "final loss" not in r.stdout, (r.stdout, r.stderr)
    errs = r.stderr.strip().splitlines()
    assert len(errs) == 3 and all("read-only file system" in e for e in errs), errs
    assert "--ckpt-dir '/mnt/ck': cannot write in it" in errs[0]
    assert "--save-hf '/mnt/out': its parent '/mnt': cannot write in it" in errs[1]
    assert "--log-file '/mnt/log': its parent '/mnt': cannot write in it" in errs[2]


@needs_tmpfs
def test_outputs_that_do_not_fit_the_disk_are_refused_up_front():
    """1 MiB of disk: a checkpoint (~1 MiB and 1 MiB of slack) and the HF save (~0.1 MiB) do not fit."""
    r = in_tmpfs('$TRAIN --steps 1 --ckpt-dir "$M/ck" --save-hf "$M/out"; echo "rc=$?"', size="1m")
    assert "rc=2" in r.stdout and "final loss" not in r.stdout, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and re.search(r"'/mnt/ck': [\d.]+ [KM]iB free on its file system", err), err
    assert "need about" in err and "(--ckpt-dir" in err and "+ --save-hf" in err, err
