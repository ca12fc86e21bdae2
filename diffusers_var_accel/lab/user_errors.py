"""Bad input, told apart from bugs: one error type and one way of turning a library's error into a one-line message.

The command line (:mod:`diffusers_var_accel.lab.cli`) and the generate job (:mod:`diffusers_var_accel.lab.generate_job`) raise
:class:`UserInputError` for a bad value (an argument, a file or folder it names, the contents of an output folder);
``var-accel`` prints it as one ``error: ...`` line with exit status 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

#: Exceptions that loading or calling a pipeline raises for bad input (a folder, a file, a value): exit status 2.
USER_INPUT_ERRORS = (ValueError, TypeError, OSError, KeyError)


class UserInputError(Exception):
    """A bad value given by the user: printed as one ``error:`` line on stderr, exit status 2."""


def one_line(err: BaseException) -> str:
    """``err``'s message on one line (its lines joined with ``; ``; a ``KeyError``'s key without the quotes)."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()) or type(err).__name__


@contextlib.contextmanager
def user_errors(prefix: str = "", debug: bool = False) -> Iterator[None]:
    """Turn the ``USER_INPUT_ERRORS`` of a step that reads user input into a :class:`UserInputError` whose message
    starts with ``prefix`` (unless it already names the same flag); ``debug``: re-raise the original error."""
    try:
        yield
    except USER_INPUT_ERRORS as err:
        if debug:
            raise
        message = one_line(err)
        flag = prefix.split(" ")[0]
        raise UserInputError(message if flag and message.startswith(flag) else f"{prefix}{message}") from err


def positive_int_argument(text: str) -> int:
    """An ``argparse`` ``type``: a positive integer (the message names the bad value)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
