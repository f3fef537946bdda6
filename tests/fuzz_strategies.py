"""Hypothesis strategies and the one rule every reader's fuzz test checks: a reader either
returns, or raises HorizonError with a one-line message; nothing else escapes (no KeyError,
TypeError, RecursionError, OverflowError, ... deep inside). Shared by tests/test_fuzz_*.py
and benchmarks/fuzz_readers.py."""
import json
import math

from hypothesis import strategies as st

from horizon_sim.errors import HorizonError

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


def one_line_or_ok(fn, *args, **kwargs):
    """Run a reader: its result, or None when it refused with a one-line HorizonError."""
    try:
        return fn(*args, **kwargs)
    except HorizonError as e:
        msg = str(e)
        assert msg and "\n" not in msg.strip(), f"not one line: {msg!r}"
        assert "Traceback" not in msg
        return None


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
