"""The one exception type the tooling raises for expected failures."""

from __future__ import annotations


class ToolError(Exception):
    """An expected failure: the message is one line and is shown without a traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __str__(self) -> str:  # keep it to one line
        return " ".join(str(self.args[0]).split("\n"))
