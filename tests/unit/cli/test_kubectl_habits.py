"""The sandbox commands take what kubectl users type: `run NAME --image=IMAGE`,
`exec -it POD -- bash`, `exec -c CONTAINER`, `logs --tail N -f`."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandman.cli.common import EXIT_USAGE, CliError, UsageError, explain
from sandman.cli.main import build_parser, main
from sandman.cli.sandboxes import exec_container, exec_mode, last_lines, run_target


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser(argv[0]).parse_args(list(argv))


def test_run_name_with_image_as_kubectl() -> None:
    args = parse("run", "web", "--image=python:3.11", "--ttl=1h")
    assert run_target(args.target, args.image, args.name) == ("python:3.11", "web")
    args = parse("run", "--image", "python:3.11")
    assert run_target(args.target, args.image, args.name) == ("python:3.11", None)
    args = parse("run", "pod/web", "--image=python:3.11")
    assert run_target(args.target, args.image, args.name) == ("python:3.11", "web")


def test_run_image_as_before() -> None:
    args = parse("run", "python:3.11", "--name", "web")
    assert run_target(args.target, args.image, args.name) == ("python:3.11", "web")
    args = parse("run", "127.0.0.1:5000/tiny:1")
    assert run_target(args.target, args.image, args.name) == ("127.0.0.1:5000/tiny:1", None)


def test_run_ambiguities_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="give the image"):
        run_target(None, None, "web")
    with pytest.raises(UsageError, match="the name is given twice"):
        run_target("web", "python:3.11", "other")
    assert explain(UsageError("x")) == (EXIT_USAGE, "x")


def test_exec_takes_i_t_and_it() -> None:
    for flags, (i, t) in {
        ("-it",): (True, True),
        ("-ti",): (True, True),
        ("-i", "-t"): (True, True),
        ("--stdin", "--tty"): (True, True),
        ("-i",): (True, False),
        ("-t",): (False, True),
    }.items():
        args = parse("exec", *flags, "sb-1")
        assert (args.stdin, args.tty, args.pod) == (i, t, "sb-1"), flags
    args = parse("exec", "-c", "sandbox", "sb-1")
    assert args.container == "sandbox"


def test_exec_mode() -> None:
    assert exec_mode(True, True, True) == (True, None)
    interactive, warning = exec_mode(True, True, False)
    assert not interactive and warning and "Unable to use a TTY" in warning
    assert exec_mode(False, True, True) == (False, None)
    assert exec_mode(True, False, True) == (False, None)


POD = {
    "metadata": {"name": "sb-1", "annotations": {"sandman.dev/container": "work"}},
    "spec": {"containers": [{"name": "sidecar"}, {"name": "work"}]},
}


def test_exec_c_accepts_the_sandbox_container_and_names_the_others() -> None:
    exec_container(POD, None)
    exec_container(POD, "work")
    with pytest.raises(CliError, match="container 'sidecar' of pod sb-1 is not the sandbox's"):
        exec_container(POD, "sidecar")
    with pytest.raises(CliError, match=r"no container 'nope' \(containers: sidecar, work\)"):
        exec_container(POD, "nope")


def test_logs_tail_and_follow() -> None:
    args = parse("logs", "sb-1", "--tail", "5", "-f")
    assert (args.tail, args.follow, args.proc) == (5, True, None)
    args = parse("logs", "sb-1", "web", "--tail=0")
    assert (args.tail, args.proc) == (0, "web")
    assert parse("logs", "sb-1").tail == -1
    assert last_lines(b"1\n2\n3\n", 2) == b"2\n3\n"
    assert last_lines(b"1\n2\n3", 1) == b"3"
    assert last_lines(b"1\n2\n", 5) == b"1\n2\n"
    assert last_lines(b"1\n2\n", 0) == b""
    assert last_lines(b"1\n2\n", -1) == b"1\n2\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["exec", "sb-1"], "give a command after --"),
        (["exec", "-d", "-i", "sb-1", "--", "cat"], "-d does not go with -i or -t"),
        (["exec", "-d", "-t", "sb-1", "--", "cat"], "-d does not go with -i or -t"),
        (["run"], "give the image"),
        (["run", "web", "--image=x:1", "--name=other"], "the name is given twice"),
    ],
)
def test_usage_errors_are_2_before_any_connection(
    argv: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No kubeconfig at all: a usage error is found before one is needed.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nothing"))
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and "kubeconfig" not in err
