"""For the planner commands that run the executor (calibrate, validate): torch is imported
only when they run, and its absence is a one-line error, not a traceback."""
import importlib
import sys

from horizon_sim.errors import HorizonError


def import_executor(module: str, verb: str):
    """The module (a dotted name), or HorizonError('<verb> needs the executor (torch): ...')."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise HorizonError(f"{verb} needs the executor (torch): {e}") from None


def say(line: str) -> None:
    """Progress for a person, on stderr (stdout stays for results and --json)."""
    print(line, file=sys.stderr, flush=True)
