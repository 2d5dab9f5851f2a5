"""The reaper's flags: rates and worker counts must be above zero."""

from __future__ import annotations

import argparse

import pytest

from sandman.reaper.config import add_flags, from_args


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_flags(p)
    return p.parse_args(list(argv))


def test_defaults_let_the_delete_budget_set_the_rate() -> None:
    opts = from_args(_parse()).options
    assert (opts.workers, opts.delete_qps, opts.delete_burst) == (32, 50.0, 200)
    assert from_args(_parse("--workers", "4", "--delete-qps", "2.5")).options.workers == 4


@pytest.mark.parametrize(
    "argv",
    [("--workers", "0"), ("--workers", "-3"), ("--delete-qps", "0"), ("--delete-burst", "x")],
)
def test_a_reaper_that_would_reclaim_nothing_is_refused(argv: tuple[str, str]) -> None:
    with pytest.raises(argparse.ArgumentError, match=argv[0]):
        _parse(*argv)
