"""The one exception type the tooling raises for expected failures."""

from __future__ import annotations

import sys
from collections.abc import Callable


class ToolError(Exception):
    """An expected failure: the message is one line and is shown without a traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __str__(self) -> str:  # keep it to one line
        return " ".join(str(self.args[0]).split("\n"))


def exit_status(action: Callable[[], object]) -> int:
    """Run ``action`` for a command line: 0, or on a :class:`ToolError` its one line on stderr
    (``error: ...``) and its exit code."""
    try:
        action()
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
