"""The one error type for bad input, shared by every layer.

It lives in costmodel (the lowest package) so that costmodel, sim and the command
line can all raise it. The command line prints ``str(err)`` as one line and exits 2.
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
        where = f"{self.source}: {self.field}" if self.field else self.source
        # One line, always: newlines in messages would break the one-line contract.
        return f"{where}: {self.message}".replace("\n", " ")
