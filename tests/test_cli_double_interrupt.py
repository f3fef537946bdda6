"""Issue 43, item 8c: a second Ctrl-C while `horizon` handles the first (a double press during
start-up) changes nothing: one line, exit 130. It printed a traceback (9 of 12 tries): the
second KeyboardInterrupt landed in threading's shutdown, an atexit callback, a `__del__` or
finalizer run while the first unwound, or past main's handler; or, during the interpreter's
teardown (SIGINT back to its default action), killed the process by SIGINT. The first Ctrl-C now
ignores the later ones (horizon_sim/cli/ctrl_c.py), and so does the program once its command
returned. A first Ctrl-C whose KeyboardInterrupt the start-up swallowed is not lost: an error it
causes is reported as the interruption, and the training loop takes it as its first SIGINT."""
import signal
import subprocess
import sys

from tests.train_run import ROOT, env

# The `horizon` program whose `train` is interrupted as it starts (the first Ctrl-C), a second
# Ctrl-C landing in a cleanup that runs while the first unwinds (as the Trainer's finalizer
# joins its lane threads) and a third in an atexit callback (the teardown).
TWICE = """
import atexit, os, signal, sys, time
sys.argv[0] = '/usr/local/bin/horizon'
from horizon_sim.cli.main import main
import horizon_exec.cli.train_cmd as train_cmd

def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)   # a handler that raises interrupts the sleep

class Cleanup:
    def __del__(self):
        ctrl_c()

def run(args):
    c = Cleanup()
    ctrl_c()
    time.sleep(30)

atexit.register(ctrl_c)
train_cmd.run = run
sys.exit(main(["train", "--model", "tests/micro_model.json"]))
"""


def _as_from_a_terminal():
    """SIGINT as a terminal leaves it (a test run in the background may inherit it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_the_cleanup_and_the_exit_after_the_first_changes_nothing():
    r = subprocess.run([sys.executable, "-c", TWICE], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=120, preexec_fn=_as_from_a_terminal)
    assert (r.returncode, r.stderr) == (130, "horizon train: interrupted\n")


# The `horizon` program whose `train` start-up swallows the Ctrl-C (as torch's C++ NumPy check
# does when it lands while NumPy initializes) and then fails for it (NumPy's next import).
SWALLOWED = """
import os, signal, sys, time
sys.argv[0] = '/usr/local/bin/horizon'
from horizon_sim.cli.main import main
import horizon_exec.cli.train_cmd as train_cmd

def run(args):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    except KeyboardInterrupt:
        pass
    raise ImportError("cannot load module more than once per process")

train_cmd.run = run
sys.exit(main(["train", "--model", "tests/micro_model.json"]))
"""


def test_an_error_out_of_a_start_up_that_ctrl_c_cut_short_is_the_interruption():
    r = subprocess.run([sys.executable, "-c", SWALLOWED], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=120, preexec_fn=_as_from_a_terminal)
    assert (r.returncode, r.stderr) == (130, "horizon train: interrupted\n")


def test_a_ctrl_c_the_start_up_swallowed_stops_the_run_at_its_first_boundary(tmp_path):
    """The start-up goes on after swallowing the KeyboardInterrupt: the training loop takes the
    press as its first SIGINT and stops before its first step (it ran the whole run)."""
    script = SWALLOWED.replace('    raise ImportError("cannot load module more than once per process")',
                               "    return real_run(args)")
    script = script.replace("import horizon_exec.cli.train_cmd as train_cmd",
                            "import horizon_exec.cli.train_cmd as train_cmd\nreal_run = train_cmd.run")
    flags = ["--batch", "2", "--seq", "32", "--steps", "4", "--no-progress", "--eval-batches", "0",
             "--ckpt-dir", str(tmp_path / "ck")]
    script = script.replace('"tests/micro_model.json"]', f'"tests/micro_model.json", *{flags!r}]')
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=120, preexec_fn=_as_from_a_terminal)
    assert "Traceback" not in r.stderr and r.returncode == 130, r.stderr
    assert "SIGINT received: stopping at the next step boundary" in r.stderr
    assert r.stderr.splitlines()[-1] == "horizon train: SIGINT: stopped after step 0; no checkpoint (none written yet)"


# The `horizon` program; `train` gets two SIGINTs 20 ms apart, `after_s` into its start.
DOUBLE_PRESS = """
import os, signal, sys, threading, time
after_s = float(sys.argv.pop(1))
sys.argv[0] = '/usr/local/bin/horizon'
from horizon_sim.cli.main import main
import horizon_exec.cli.train_cmd as train_cmd
real_run = train_cmd.run

def double_press():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)

def run(args):
    threading.Timer(after_s, double_press).start()
    return real_run(args)

train_cmd.run = run
sys.exit(main(["train", "--model", "tests/micro_model.json", "--batch", "2", "--seq", "32", "--steps", "1000",
               "--no-progress", "--eval-batches", "0"]))
"""


def test_two_ctrl_c_in_quick_succession_while_train_starts_are_one_line_exit_130():
    """As a person's double press: two SIGINTs 20 ms apart, while torch imports and later in the
    start-up (or, on a fast machine, in the first steps: the loop's own handling, also exit 130)."""
    for after_s in (0.2, 0.8):
        r = subprocess.run([sys.executable, "-c", DOUBLE_PRESS, str(after_s)], cwd=ROOT, env=env(),
                           capture_output=True, text=True, timeout=120, preexec_fn=_as_from_a_terminal)
        assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
        assert r.returncode == 130, (after_s, r.returncode, r.stderr)
        assert r.stderr.splitlines()[-1].startswith("horizon train: "), r.stderr
