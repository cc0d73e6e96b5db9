"""The one error type for bad input, shared by every layer.

It lives in costmodel (the lowest package) so that costmodel, sim and the command
line can all raise it. The command line prints ``str(err)`` as one line and exits 2
(a failed real run, RunError, as one line with exit 1).
"""
from __future__ import annotations


class InputError(Exception):
    """Bad user input: names the file, the field and what is allowed.

    ``source`` is the file path (or ``--plan``/``--model`` for command-line strings),
    ``field`` a dotted path to the offending value, ``message`` what is wrong and what
    is allowed.
    """

    def __init__(self, source: str | None, field: str | None, message: str):
        self.source = source or "<input>"
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __reduce__(self):
        # Rebuilt from its three parts, so an InputError raised in a worker process (the
        # process pools of `plansim accuracy` and `calibrate --runs`) reaches the command
        # line as itself: one line, exit 2, not a BrokenProcessPool traceback.
        return (type(self), (self.source, self.field, self.message))

    def __str__(self) -> str:
        where = f"{clip(self.source)}: {clip(self.field)}" if self.field else clip(self.source)
        # One line, always: newlines in messages would break the one-line contract.
        return f"{where}: {clip(self.message, MAX_MESSAGE)}".replace("\n", " ")


class RunError(RuntimeError):
    """A real run failed through no fault of the input: a worker process raised, hung past
    its timeout or was killed (validate/launch.WorkerError). The command line prints it as
    one line naming the rank and exits 1; defined here, beside InputError, so the command
    line can catch it without importing the validator."""


# A path, field or value in an error is shown up to this many characters (a 100,000-
# character --model argument made a 100 kB error line); the middle goes, so both the
# start and the file name at the end stay readable.
MAX_PART = 200
MAX_MESSAGE = 1000


def clip(text: str, limit: int = MAX_PART) -> str:
    """``text`` cut in the middle to at most about ``limit`` characters."""
    text = str(text)
    if len(text) <= limit:
        return text
    keep = (limit - 5) // 2
    return f"{text[:keep]} ... {text[-keep:]}"


# An "allowed:" list longer than this is cut to the names closest to the one given: the
# runtime settings alone are 30 names, and the whole error must stay one readable line.
ALLOWED_CHARS = 400


def allowed_names(key, names, where: str = "") -> str:
    """'allowed: a, b, c' for an unknown ``key``: every name when they fit in
    ALLOWED_CHARS, else the closest few (difflib) and how many there are, with ``where``
    they are listed."""
    import difflib
    names = sorted(str(n) for n in names)
    text = ", ".join(names)
    if len(text) <= ALLOWED_CHARS:
        return f"allowed: {text}"
    close = difflib.get_close_matches(str(key)[:60], names, n=4, cutoff=0.6)
    hint = f"closest: {', '.join(close)}; " if close else ""
    return f"allowed: one of {len(names)} names ({hint}all in {where or 'the documentation'})"
