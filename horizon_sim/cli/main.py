"""The `horizon` command. Each subcommand is a module with configure(parser) and run(args);
modules are torch-free at import, so `horizon plan` starts fast and `horizon train` loads
torch only when it runs."""
import os
import signal
import sys


def interrupted_at_start(signum, frame):
    """Ctrl-C while the command is still importing and building its parser: nothing has been
    done yet, so one line and exit 130, not a KeyboardInterrupt traceback from an import."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not run this again
    try:
        os.write(2, b"horizon: interrupted\n")
    finally:
        os._exit(130)


def ignore_sigint() -> None:
    """The process only exits from here: a Ctrl-C changes nothing (the program only, not a test
    or a library calling main(); Python delivers signals to the main thread only)."""
    if AS_PROGRAM and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


# Only as the program (`python -m horizon_sim.cli.main`, the `horizon` script), not when a test or
# a library imports this module; not where SIGINT is ignored (a background job).
AS_PROGRAM = __name__ == "__main__" or os.path.basename(sys.argv[0] or "") == "horizon"
if AS_PROGRAM and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, interrupted_at_start)

import argparse  # noqa: E402 - after the handler: these imports are what Ctrl-C interrupted
import contextlib  # noqa: E402
import importlib  # noqa: E402
import threading  # noqa: E402

from horizon_sim.cli import ctrl_c  # noqa: E402
from horizon_sim.cli.explicit_flags import record_explicit  # noqa: E402
from horizon_sim.cli.stdout_guard import keep_running_without_stdout, reopen_closed_std_fds  # noqa: E402
from horizon_sim.cli.stuck_threads import exit_past_stuck_threads  # noqa: E402
from horizon_sim.errors import HorizonError

# name -> (module, one-line help). Order is the order of `horizon --help`.
COMMANDS = {
    "plan": ("horizon_sim.cli.plan_cmd", "does it fit, how fast, what is the bottleneck"),
    "simulate": ("horizon_sim.cli.simulate_cmd", "one step as a Gantt overlap plot and a Perfetto trace"),
    "tune": ("horizon_sim.cli.tune_cmd", "the fastest policy that fits, and speed against host RAM"),
    "min-ram": ("horizon_sim.cli.min_ram_cmd", "the smallest host RAM (64 GiB steps) a job fits in"),
    "max-model": ("horizon_sim.cli.max_model_cmd", "the largest model that fits a GPU and a RAM size"),
    "sweep": ("horizon_sim.cli.sweep_cmd", "models x hardware x policies -> table + feasibility map"),
    "train": ("horizon_exec.cli.train_cmd", "train for real with the streaming executor"),
    "calibrate": ("horizon_exec.cli.calibrate_cmd", "measure this machine and write a hardware file"),
    "validate": ("horizon_exec.cli.validate_cmd", "predicted vs measured on small configurations -> reports/"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="horizon",
        description="RAM-centric LLM training on one GPU box: plan it (a SimPy model of the "
                    "step), then run the same schedule for real.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", required=True)
    for name, (module, help_) in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:  # e.g. the executor's extra is not installed
            continue
        cmd = sub.add_parser(name, help=help_)
        mod.configure(cmd)
        record_explicit(cmd)  # which flags were given, whatever their values (cli/explicit_flags.py)
    return p


def main(argv: list[str] | None = None, args: argparse.Namespace | None = None) -> int:
    """Run `horizon` on argv (default sys.argv[1:]), or on arguments already parsed (`args`,
    with .cmd: a worker of a data-parallel run gets its parent's)."""
    rc = _run(argv, args)
    if AS_PROGRAM:  # the process ends next
        ignore_sigint()  # a Ctrl-C now would only turn exit `rc` into a traceback or death by SIGINT
        exit_past_stuck_threads(rc)  # past a thread stuck in native code, without the teardown
    return rc


def _run(argv: list[str] | None, args: argparse.Namespace | None) -> int:
    reopen_closed_std_fds()  # `horizon train >&-`: output dropped, the run goes on (stdout_guard.py)
    if args is None:
        try:
            args = _parser().parse_args(argv)
        except KeyboardInterrupt:
            ignore_sigint()
            print("horizon: interrupted", file=sys.stderr)
            return 130
    guarded = False
    try:  # from the first statement on: a KeyboardInterrupt anywhere below is one line
        if signal.getsignal(signal.SIGINT) is interrupted_at_start:  # the command's own handling from here
            signal.signal(signal.SIGINT, ctrl_c.interrupt_once)  # a double press is one line (ctrl_c.py)
        mod = importlib.import_module(COMMANDS[args.cmd][0])
        # A command whose product is files (training) does not stop when its stdout fails
        # (stdout_guard.py); the others' product is their output, so a reader that left ends them.
        guarded = getattr(mod, "KEEP_RUNNING_WITHOUT_STDOUT", False)
        with keep_running_without_stdout(args.cmd) if guarded else contextlib.nullcontext():
            return mod.run(args)
    except HorizonError as e:
        print(f"horizon {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError as e:
        if guarded:  # not stdout (the guard takes those): some other pipe broke
            print(f"horizon {args.cmd}: error: {e}", file=sys.stderr)
            return 1
        # `horizon plan | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if e.filename is not None:  # a file or folder no message above named: name it now
            print(f"horizon {args.cmd}: error: {_os_error_on(e)}", file=sys.stderr)
            return 1
        # stdout on a full disk, a quota, an I/O error: the output is lost, say so
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        print(f"horizon {args.cmd}: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        ignore_sigint()
        print(f"horizon {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except MemoryError as e:  # past admission (an estimate) or under a limit it could not see: one line
        detail = f" ({e})" if str(e) else ""
        print(f"horizon {args.cmd}: error: out of memory: an allocation failed{detail}; give the process more "
              f"memory (ulimit -v, other processes) or make the run smaller (--batch, --seq, --loss-chunk-tokens)",
              file=sys.stderr)
        return 1
    except Exception:
        if not ctrl_c.seen():
            raise
        ignore_sigint()  # what Ctrl-C cut short failed (its KeyboardInterrupt swallowed): the interruption is the news
        print(f"horizon {args.cmd}: interrupted", file=sys.stderr)
        return 130


def _os_error_on(e: OSError) -> str:
    """'<path>: <why>' (with the second path of a rename or a link): what failed, and on what."""
    where = os.fsdecode(e.filename) + (f" -> {os.fsdecode(e.filename2)}" if e.filename2 is not None else "")
    return f"{where}: {e.strerror or e}"


if __name__ == "__main__":
    sys.exit(main())
