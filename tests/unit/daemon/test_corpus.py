"""The daemon API's hostile-input corpus (tests/corpus/daemon) against one
real daemon process: every case holds, and the daemon stays healthy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.daemon import corpus
from tests.unit.daemon.helpers import TOKEN, start_daemon, stop_daemon

pytestmark = pytest.mark.daemon_process

CASES = list(corpus.load())


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[corpus.Target, set[int]]]:
    root = tmp_path_factory.mktemp("corpus")
    d = start_daemon(root)
    t = corpus.Target("127.0.0.1", d.port, TOKEN, str(root / "d"), str(root / "scratch"))
    try:
        yield t, set()
    finally:
        stop_daemon(d)
        log = d.proc.stdout.read().decode(errors="replace") if d.proc.stdout else ""
        # The daemon logs what it refused; it must never have crashed on any of it.
        assert "Traceback" not in log, log[-3000:]


@pytest.mark.parametrize(("doc", "case"), [pytest.param(d, c, id=i) for i, d, c in CASES])
def test_corpus_case(
    target: tuple[corpus.Target, set[int]], doc: dict[str, Any], case: dict[str, Any]
) -> None:
    t, done = target
    if id(doc) not in done:
        done.add(id(doc))
        assert corpus.setup(doc, t) == []
    problems = corpus.run_case(case, t)
    assert problems == [], "\n".join(problems)


def test_the_corpus_files_parse() -> None:
    assert CASES, f"no cases under {corpus.CORPUS}"
    assert all(Path(corpus.CORPUS).glob("*.yaml"))
