"""The one reader of the JSON and TOML files a user names (config.json, tokenizer_config.json,
a safetensors index, --hardware, a sweep grid, --published rows, JSONL data records, a
schedule): whatever the file holds, the result is the parsed value or a one-line ReadError
'<file>: <why>' (a HorizonError: the CLI's exit 2), with the line and column where the parser
gives one.

Python's parsers raise more than their decode errors, each of which used to reach the
terminal as a traceback from some reader:
- ValueError for an integer of more than sys.get_int_max_str_digits() digits (4300: the
  conversion is quadratic, so Python refuses it);
- RecursionError for arrays or objects nested near the recursion limit (about 1000 levels for
  json's C scanner, a few hundred for tomllib);
- UnicodeDecodeError for bytes that are not UTF-8;
and json accepts a lone surrogate ("\\ud800"): valid JSON but not text, on which a tokenizer,
an encode or a print fails later, far from the file.

What parses is then walked once, without recursion, and refused when it nests more than
MAX_NESTING levels: Python could still read a few hundred, but any code that walks the value
recursively (a repr in an error message, a deep copy) would fail on it. Called by every reader
of user files; tests/test_safe_read.py checks that no other module parses JSON or TOML outside
an allow-list of internal readers (pipes and files Horizon itself wrote)."""
import json
import re
import sys
import tomllib
from pathlib import Path

from horizon_sim.errors import HorizonError
from horizon_sim.safe_files import kind_of

MAX_NESTING = 128
"""Levels of arrays and objects (tables) a file may nest: serde_json's limit, which the
`tokenizers` and `safetensors` libraries apply to tokenizer.json and safetensors headers. HF
configs nest 3 or 4 levels, Horizon's TOML files 2, chat records with tool schemas a dozen."""


class ReadError(HorizonError):
    """A file (or text) that cannot be parsed: '<where>: <why>'; `why` alone for callers that
    re-raise it as their own error type."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


def read_json(path, where: str | None = None):
    """The JSON value of the file at `path` (named `where` in errors, default the path)."""
    where = str(path) if where is None else where
    return loads_json(_read_bytes(path, where), where)


def read_toml(path, where: str | None = None) -> dict:
    """The TOML document of the file at `path` (named `where` in errors, default the path)."""
    where = str(path) if where is None else where
    return loads_toml(_read_bytes(path, where), where)


def read_toml_file(path, where: str) -> dict:
    """read_toml of a file the user named, which must exist as a regular file: '<where>: not
    found' or '<where>: not a file' otherwise (a hardware file, a job file)."""
    p = Path(path)
    if not p.is_file():
        raise ReadError(where, "not found" if not p.exists() else "not a file")
    return read_toml(p, where)


def loads_json(text: str | bytes, where: str):
    """The JSON value of `text` (bytes must be UTF-8); `where` names it in errors ('file:line'
    for a JSONL record)."""
    if isinstance(text, bytes):
        text = _decode(text, where)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReadError(where, f"not valid JSON: {e.msg} (at {_position(text, e.pos)})") from None
    except ValueError as e:  # an integer past the conversion limit: the only other ValueError
        raise ReadError(where, _too_many_digits(e)) from None
    except RecursionError:
        raise ReadError(where, _too_deep("arrays or objects")) from None
    _check_values(doc, where, "arrays or objects")
    return doc


def loads_toml(text: str | bytes, where: str) -> dict:
    """The TOML document of `text` (bytes must be UTF-8); `where` names it in errors."""
    if isinstance(text, bytes):
        text = _decode(text, where)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # its message ends '(at line L, column C)'
        raise ReadError(where, f"not valid TOML: {e}") from None
    except ValueError as e:
        raise ReadError(where, _too_many_digits(e)) from None
    except RecursionError:
        raise ReadError(where, _too_deep("arrays or tables")) from None
    _check_values(doc, where, "arrays or tables")
    return doc


def _read_bytes(path, where: str) -> bytes:
    kind = kind_of(path)
    if kind is not None:  # never opened: a FIFO would block until a writer came
        raise ReadError(where, f"is {kind}, not a regular file; give a file")
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ReadError(where, f"cannot read ({e.strerror or e})") from None


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReadError(where, f"not UTF-8 text (at {_position(data, e.start)}: byte 0x{data[e.start]:02x})") from None


def _position(text: str | bytes, offset: int) -> str:
    """'line L, column C' of `offset`, or 'column C' in a text of one line (a JSONL record)."""
    nl = "\n" if isinstance(text, str) else b"\n"
    start = text.rfind(nl, 0, offset) + 1
    col = offset - start + 1
    if nl not in text.rstrip():
        return f"column {col}"
    return f"line {text.count(nl, 0, offset) + 1}, column {col}"


def _too_many_digits(e: ValueError) -> str:
    limit = sys.get_int_max_str_digits()
    m = re.search(r"value has (\d+) digits", str(e))
    if m is None:  # not the digit limit after all: say what the parser said
        return f"cannot read ({str(e).split(';')[0]})"
    return (f"an integer of {m.group(1)} digits; allowed: up to {limit} digits (Python's integer conversion "
            "limit; no setting needs more)")


def _too_deep(what: str) -> str:
    return f"nested too deeply (more than {MAX_NESTING} levels of {what}; allowed: up to {MAX_NESTING})"


def _check_values(doc, where: str, what: str) -> None:
    """ReadError when `doc` nests more than MAX_NESTING levels or a string (or key) holds a
    lone surrogate. Walked level by level, without recursion."""
    level, depth = [doc], 0
    while level:
        below, containers = [], False
        for v in level:
            if isinstance(v, str):
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ReadError(where, f"a string holds a lone surrogate {v[e.start]!r} (not text; write "
                                           "the character itself or a surrogate pair)") from None
            elif isinstance(v, dict):
                containers = True
                below.extend(v.keys())
                below.extend(v.values())
            elif isinstance(v, list):
                containers = True
                below.extend(v)
        depth += containers
        if depth > MAX_NESTING:
            raise ReadError(where, _too_deep(what))
        level = below
