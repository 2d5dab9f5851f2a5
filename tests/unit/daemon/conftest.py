"""Fixtures for the daemon tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.daemon.helpers import Daemon, start_daemon, stop_daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path)
    yield d
    stop_daemon(d)
