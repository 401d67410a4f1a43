"""The search's storage (``tools.tune``): the database URL as the study opens it (``database_url``: PostgreSQL through
psycopg 3 with a connect timeout), its password hidden in messages (``shown``), and the storage opened with the
workers' heartbeat (``finetune.train.trial.open_storage``), retried while workers race to create a new database's
tables (``connect``), or one line saying why not (``open_study_storage``).
"""

from __future__ import annotations

import argparse
import logging
import random
import time

from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from finetune.train.trial import open_storage

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10  # seconds a PostgreSQL connection may take (database_url)


def database_url(url: str) -> str:
    """``url`` as the search opens it: a ``postgresql://`` URL without a driver gets psycopg 3, the tune extra's
    (``postgresql+psycopg://``; SQLAlchemy's default, psycopg2, is not installed), and a ``connect_timeout`` of
    ``CONNECT_TIMEOUT`` seconds unless it names one (libpq waits for an unreachable host as long as TCP does). Any
    other URL is returned unchanged.

    Raises:
        sqlalchemy.exc.ArgumentError: not a database URL (the message does not repeat it: it may hold a password).
    """
    parsed = make_url(url)
    if parsed.drivername != "postgresql":
        return url
    query = {"connect_timeout": str(CONNECT_TIMEOUT), **parsed.query}
    return parsed.set(drivername="postgresql+psycopg", query=query).render_as_string(hide_password=False)


def shown(url: str) -> str:
    """``url`` with its password as ``***``, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def connect(args: argparse.Namespace, attempts: int = 5):
    """``args.storage`` opened with the heartbeat. Workers started together on a new database race to create its
    tables (SQLite: "table studies already exists" in all but one); the losers try again after a second or two.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database still fails after ``attempts`` tries (a bad URL, no server).
    """
    for attempt in range(1, attempts + 1):
        try:
            return open_storage(args.storage, args.heartbeat, args.grace)
        except SQLAlchemyError as err:
            if attempt == attempts:
                raise
            log.info("Storage %s not ready (%s); trying again", shown(args.storage), type(err).__name__)
            time.sleep(1 + random.random())


def open_study_storage(args: argparse.Namespace):
    """``args.storage`` opened (``connect``), Optuna's ``RDBStorage``.

    Raises:
        SystemExit: the storage cannot be opened (no server, a refused login, no driver): one line naming its URL,
            password hidden.
    """
    try:
        return connect(args)
    except SQLAlchemyError as err:
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise SystemExit(f"tools.tune: cannot open the storage {shown(args.storage)}: {reason}") from None
    except ImportError as err:
        raise SystemExit(f"tools.tune: cannot open the storage {shown(args.storage)}: its driver is not installed "
                         f"({err.__cause__ or err})") from None
