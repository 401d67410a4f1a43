"""What the commands in tools/ share on their command line."""

from __future__ import annotations

import argparse


def positive_int(value: str) -> int:
    """argparse's type for counts: an integer of at least 1.

    Raises:
        argparse.ArgumentTypeError: ``value`` is not an integer, or is below 1 (argparse prints it as one line naming
            the argument).
    """
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number
