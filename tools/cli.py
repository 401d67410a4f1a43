"""What the commands in tools/ share on their command line."""

from __future__ import annotations

import argparse


def positive_int(value: str) -> int:
    """argparse's type for counts: an integer of at least 1.

    Raises:
        argparse.ArgumentTypeError: ``value`` is not an integer, or is below 1 (argparse prints it as one line naming
            the argument).
    """
    return _int_from(value, 1)


def non_negative_int(value: str) -> int:
    """argparse's type for counts that may be 0: an integer of at least 0.

    Raises:
        argparse.ArgumentTypeError: ``value`` is not an integer, or is below 0.
    """
    return _int_from(value, 0)


def positive_float(value: str) -> float:
    """argparse's type for durations and scales: a number above 0.

    Raises:
        argparse.ArgumentTypeError: ``value`` is not a number, or is not above 0.
    """
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
    return number


def seconds(value: str) -> float:
    """argparse's type for a wait in seconds: a number of at least 0.

    Raises:
        argparse.ArgumentTypeError: ``value`` is not a number, or is below 0.
    """
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return number


def port(value: str) -> int:
    """argparse's type for a server's port: 1024 to 65535 (LitServe's range; lower ones need root).

    Raises:
        argparse.ArgumentTypeError: ``value`` is not an integer in that range.
    """
    number = _int_from(value, 1024)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"must be at most 65535, got {number}")
    return number


def _int_from(value: str, lowest: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < lowest:
        raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {number}")
    return number
