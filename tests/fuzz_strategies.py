"""Hypothesis strategies and the one rule every reader's fuzz test checks: a reader either
returns, or raises HorizonError with a one-line message; nothing else escapes (no KeyError,
TypeError, RecursionError, OverflowError, ... deep inside). Shared by tests/test_fuzz_*.py
and benchmarks/fuzz_readers.py."""
import json
import math
import os

from hypothesis import strategies as st

from horizon_sim.errors import HorizonError

# Lines that are JSON to some readers and not to Python's, or not text: lone surrogates, an
# integer past the 4300-digit conversion limit, nesting past the recursion limit.
AWKWARD_LINES = st.sampled_from([
    '{"text": "bad \\ud800"}', '{"text": "x\\udfff"}', '{"\\ud800": 1, "text": "x"}',
    '{"messages": [{"role": "user", "content": "bad \\ud800"}]}',
    '{"text": ' + "9" * 5000 + '}', '{"text": "x", "n": -' + "1" * 4400 + '}',
    '{"text": ' + "[" * 5000 + "]" * 5000 + '}', "[" * 3000 + "]" * 3000,
    '{"text": "ok", "x": ' + '{"a": ' * 2000 + "1" + "}" * 2000 + '}',
    '{"text": "emoji \\ud83d\\ude00 fine"}', '{"text": 1e999}', '{"text": NaN}'])

# JSON values of every type, including the awkward ones: huge and non-finite numbers, deep
# nesting, empty containers, unicode and NUL in strings.
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, -1, 1, 2**31, 2**63, 1e308, -0.0]),
    st.text(max_size=12), st.sampled_from(["", "\x00", "silu", "llama", "bf16", "nt", "é"]))
JSON = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                    st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                    max_leaves=12)


def mutate(base: dict, data, keys=None) -> dict:
    """`base` with a few of its keys (or of `keys`) replaced by arbitrary JSON, some removed,
    and maybe an unknown key added."""
    d = dict(base)
    names = sorted(keys if keys is not None else base)
    for k in data.draw(st.lists(st.sampled_from(names), max_size=3, unique=True), label="replace"):
        d[k] = data.draw(JSON, label=k)
    for k in data.draw(st.lists(st.sampled_from(names), max_size=2, unique=True), label="drop"):
        d.pop(k, None)
    if data.draw(st.booleans(), label="add unknown"):
        d[data.draw(st.text(min_size=1, max_size=10), label="new key")] = data.draw(JSON, label="new value")
    return d


def dumps(d) -> str:
    """JSON text, with non-finite floats as the NaN/Infinity Python's json writes (a file a
    user's tool may well produce)."""
    return json.dumps(d, allow_nan=True)


def count(outcome: str) -> None:
    """Tally one example's outcome (accepted, refused, other) for benchmarks/fuzz_readers.py:
    a line '<test> <outcome>' appended to $HORIZON_FUZZ_COUNTS when it is set."""
    path = os.environ.get("HORIZON_FUZZ_COUNTS")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split("[")[0].split(" ")[0]
        with open(path, "a") as f:
            f.write(f"{test} {outcome}\n")


def one_line_or_ok(fn, *args, counted: bool = True, **kwargs):
    """Run a reader: its result, or None when it refused with a one-line HorizonError.
    counted=False: a follow-up call on what the reader accepted (not an example of its own)."""
    try:
        out = fn(*args, **kwargs)
    except HorizonError as e:
        msg = str(e)
        ok = bool(msg) and "\n" not in msg.strip() and "Traceback" not in msg
        if counted:
            count("refused" if ok else "other")
        assert msg and "\n" not in msg.strip(), f"not one line: {msg!r}"
        assert "Traceback" not in msg
        return None
    except BaseException:
        if counted:
            count("other")
        raise
    if counted:
        count("accepted")
    return out


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
