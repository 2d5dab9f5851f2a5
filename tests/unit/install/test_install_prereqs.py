"""`sandman install` says up front that it needs kubectl, before writing anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandman.cli.main import main


@pytest.mark.parametrize("dry_run", ["client", "none"])
def test_without_kubectl_nothing_is_written_and_the_error_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dry_run: str
) -> None:
    overlay = tmp_path / "overlay"
    missing = str(tmp_path / "no-kubectl-here")
    argv = ["install", "--registry", "ghcr.io/acme", "--allow-registry", "docker.io/*"]
    argv.append(f"--dry-run={dry_run}")
    argv += ["--kubectl", missing, "--overlay-dir", str(overlay)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"{missing} not found" in err
    assert "install kubectl" in err and "--kubectl PATH" in err
    assert "Traceback" not in err
    assert not overlay.exists()


def test_a_bare_dry_run_is_client_as_kubectl_reads_it() -> None:
    from sandman.cli.main import build_parser

    args = build_parser("install").parse_args(["install", "--dry-run", "--registry", "r.io/a"])
    assert args.dry_run == "client"
    assert build_parser("install").parse_args(["install"]).dry_run == "none"
