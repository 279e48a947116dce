"""The one error convention of the package's scripts (analysis/*.py, or ``python3 -m mfattn.<script>``).

Bad input -- a missing or unreadable file, a file that is not what the script takes, an option
value it refuses -- prints one line ``<script>: <message>`` on stderr and exits with status 2,
the status of argparse's own usage errors (which print their usage line first) and of the
mfattn binary's. No traceback is shown for such an error. Success is exit status 0.

A script's main is written as

    @script("plot_run.py")
    def main(argv: list[str] | None = None) -> None:
        args = parser.parse_args(argv)
        ...                       # raises ValueError, OSError or KeyError for bad input

and its file ends with ``raise SystemExit(main())``. Bad input is raised as one of
``BAD_INPUT_ERRORS`` (ValueError, with its subclass BadInput for a script's own refusals; OSError
for a file that cannot be read or written; KeyError for an HDF5 object that a foreign file
lacks): the message is the line shown, after the script's name.
"""
from __future__ import annotations

import functools
import re
import sys
from typing import Any, Callable

EXIT_BAD_INPUT = 2
BAD_INPUT_ERRORS = (OSError, ValueError, KeyError)

__all__ = ["BadInput", "BAD_INPUT_ERRORS", "EXIT_BAD_INPUT", "error_line", "fail", "script"]


class BadInput(ValueError):
    """Bad input a script finds itself (an empty folder, a refused option): its message is the
    line shown."""


def error_line(error: BaseException | str) -> str:
    """The message of ``error`` on one line (line breaks and the spaces around them become one
    space); a KeyError's key as it is, not its repr."""
    shown = error.args[0] if isinstance(error, KeyError) and error.args else error
    text = re.sub(r"\s*\n\s*", " ", str(shown).strip())
    return text or type(error).__name__


def fail(prog: str, error: BaseException | str) -> int:
    """Prints ``<prog>: <message>`` on stderr and returns EXIT_BAD_INPUT."""
    print(f"{prog}: {error_line(error)}", file=sys.stderr)
    return EXIT_BAD_INPUT


def script(prog: str) -> Callable[[Callable[..., Any]], Callable[..., int]]:
    """Decorator of a script's ``main(argv=None)``: returns 0 after it (or the int it returns),
    and ``fail(prog, error)`` (exit 2) for one of BAD_INPUT_ERRORS."""

    def decorate(main: Callable[..., Any]) -> Callable[..., int]:
        @functools.wraps(main)
        def wrapper(argv: list[str] | None = None) -> int:
            try:
                status = main(argv)
            except BAD_INPUT_ERRORS as error:
                return fail(prog, error)
            return 0 if status is None else int(status)

        return wrapper

    return decorate
