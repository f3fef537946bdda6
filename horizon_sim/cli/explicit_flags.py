"""Which flags the user gave, whatever their values: every option's action notes its dest while
argparse reads the command line (defaults are never set through an action), so a flag given
with its default value still counts as given. `horizon train --job` lets the given flags
override the job's fields; `horizon tune` and `horizon train` pin the policy knobs they set and
let the planner search the rest (plan/pinned.py)."""
import argparse

EXPLICIT = "explicit_flags"
"""The Namespace attribute that holds {dest: option string} of the flags given (a dict, which
the launcher's worker arguments leave out: the ranks get the merged values)."""


class _Recorded:
    """Mixin of an argparse action that notes its dest as given (record_explicit)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, EXPLICIT, None)
        if given is None:
            given = {}
            setattr(namespace, EXPLICIT, given)
        given[self.dest] = option_string
        super().__call__(parser, namespace, values, option_string)


_RECORDED: dict[type, type] = {}


def record_explicit(p: argparse.ArgumentParser) -> None:
    """Make every option of `p` note, when it is given, its dest in the namespace (EXPLICIT).
    Call once the parser has all its options."""
    for action in p._actions:
        cls = type(action)
        if not action.option_strings or isinstance(action, (_Recorded, argparse._HelpAction)):
            continue
        if cls not in _RECORDED:
            _RECORDED[cls] = type(f"Recorded{cls.__name__}", (_Recorded, cls), {})
        action.__class__ = _RECORDED[cls]


def given(a: argparse.Namespace) -> dict:
    """{dest: option string} of the flags given on the command line ({} when none or unrecorded)."""
    return dict(getattr(a, EXPLICIT, None) or {})
