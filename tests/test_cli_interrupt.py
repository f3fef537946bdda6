"""Issue 30: Ctrl-C in the first moments of any command, while it imports its modules and builds
its parser, is one line and exit 130, not a KeyboardInterrupt traceback out of an import."""
import signal
import subprocess
import sys

from horizon_sim.cli import main as cli_main
from tests.train_run import ROOT, env

# The `horizon` script imports the entry point; a SIGINT arrives before main() has run.
AS_THE_SCRIPT = ("import os, signal, sys, time; sys.argv[0] = '/usr/local/bin/horizon'; "
                 "import horizon_sim.cli.main; os.kill(os.getpid(), signal.SIGINT); time.sleep(10)")


def _as_from_a_terminal():
    """SIGINT as a terminal leaves it. A test run launched in the background by a shell without
    job control inherits it ignored, and then (rightly) so does horizon: Ctrl-C cannot reach it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_the_entry_point_imports_is_one_line_exit_130():
    r = subprocess.run([sys.executable, "-c", AS_THE_SCRIPT], cwd=ROOT, env=env(), capture_output=True,
                       text=True, timeout=60, preexec_fn=_as_from_a_terminal)
    assert (r.returncode, r.stderr) == (130, "horizon: interrupted\n")


def test_ctrl_c_while_the_parser_is_built_is_one_line_exit_130(monkeypatch, capsys):
    def interrupted(name):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli_main.importlib, "import_module", interrupted)
    assert cli_main.main(["plan", "--help"]) == 130
    assert capsys.readouterr().err == "horizon: interrupted\n"


def test_importing_the_entry_point_leaves_sigint_alone():
    """A test or library that imports it keeps Python's KeyboardInterrupt."""
    assert signal.getsignal(signal.SIGINT) is not cli_main.interrupted_at_start
