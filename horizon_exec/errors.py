"""Executor errors. A bad request (a device budget too small for the schedule) is a
HorizonError with a one-line explanation; a failure while running an op is an ExecError that
names the op and its lane and chains the original exception."""
from horizon_sim.errors import HorizonError


class DeviceBudgetError(HorizonError):
    """An allocation would take device memory past the arena's byte budget."""


class ExecError(RuntimeError):
    """An op failed (or a lane hung) while the engine ran a schedule."""

    def __init__(self, message: str, op=None):
        super().__init__(message)
        self.op = op


class _Names(dict):
    """format_map's lookup for a ConfigError's `want`: {field} is the field's bare name ('lr',
    '--lr'), {field=} its name as a value's prefix ('lr=', '--lr ')."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def __missing__(self, key: str) -> str:
        return self.name(key[:-1]) if key.endswith("=") else self.name(key).rstrip("= ")


_UNSHOWN = object()


class ConfigError(HorizonError):
    """A configuration value that is not allowed, in one line: the field, its value (unless
    `value` is left out) and what is allowed (`want`, which names other fields as {field} or
    {field=}; field None: `want` alone). The parts are kept, so that whoever set the value by
    another name (the CLI: by its flag) hears the same rule in its own words: as_flags().
    name(field) is the field's name as a value's prefix (default 'field='); show: how the value
    is written (default repr); flag_want: the rule worded for the flags, where it differs."""

    def __init__(self, field: str | None, value=_UNSHOWN, want: str = "", *, name=lambda f: f"{f}=", show=repr,
                 flag_want: str | None = None):
        self.field, self.value, self.want, self.show = field, value, want, show
        self.flag_want = want if flag_want is None else flag_want
        super().__init__(self._text(name, self.want))

    def as_flags(self, flags: dict[str, str]) -> HorizonError:
        """The same error with each field named by its flag (flags: field -> '--flag')."""
        return HorizonError(self._text(lambda f: f"{flags[f]} " if f in flags else f"{f}=", self.flag_want))

    def _text(self, name, want: str) -> str:
        want = want.format_map(_Names(name))
        if self.field is None:
            return want
        head = name(self.field).rstrip("= ") if self.value is _UNSHOWN else f"{name(self.field)}{self.show(self.value)}"
        return head + ("" if want.startswith(":") else " ") + want
