"""The project's own error type. Anything a user can get wrong raises HorizonError with a
one-line message naming the bad value and what is allowed; the CLI turns it into exit code 2."""


class HorizonError(ValueError):
    """A bad input or an infeasible request, explained in one line."""
