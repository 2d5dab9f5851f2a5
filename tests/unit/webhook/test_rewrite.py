"""What a pod runs as a sandbox: command/args against Kubernetes' rules, the target
container, lifetime, readiness and scheduler choices (pure)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import pytest

from sandman.contract import ANN_CONTAINER, ANN_EXIT_WITH_COMMAND, LABEL_SANDBOX
from sandman.oci import ImageConfig
from sandman.webhook.mutate import InjectionSettings, MutationError, mutate
from sandman.webhook.policy import RuleSet
from sandman.webhook.rewrite import (
    ANN_DEFAULT_CONTAINER,
    ImageFacts,
    RewriteError,
    command_for,
    exits_with_command,
    image_to_resolve,
    readiness,
    scheduler_for,
    target_index,
)
from tests.unit.webhook.jsonpatch import apply

IMAGE = ImageConfig(entrypoint=("/entry.sh", "--flag"), cmd=("serve", "$(HOME)"))
DAEMON = ["/.sandman/rt/bin/sandmand", "-I", "-S", "-m", "sandman.daemon", "serve"]
DAEMON += ["--listen=0.0.0.0:7878"]


# -- command/args: the four cases, as Kubernetes runs them -----------------------------
@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        # neither: ENTRYPOINT + CMD (image words escaped against $(VAR) expansion)
        (None, None, ["/entry.sh", "--flag", "serve", "$$(HOME)"]),
        # args only: ENTRYPOINT + args (the pod's args are expanded as before)
        (None, ["x", "$(POD)"], ["/entry.sh", "--flag", "x", "$(POD)"]),
        # command only: the image's CMD is ignored too
        (["run"], None, ["run"]),
        # both: command + args
        (["run"], ["-v"], ["run", "-v"]),
        # empty lists count as absent
        ([], [], ["/entry.sh", "--flag", "serve", "$$(HOME)"]),
    ],
)
def test_command_and_args_against_the_image(
    command: list[str] | None, args: list[str] | None, expected: list[str]
) -> None:
    assert command_for(command, args, IMAGE) == expected


def test_image_edge_cases() -> None:
    assert command_for(None, None, ImageConfig(cmd=("sh",))) == ["sh"]  # CMD only
    assert command_for(None, None, ImageConfig(entrypoint=("",), cmd=("sh",))) == ["sh"]
    assert command_for(None, None, ImageConfig()) == []  # nothing: the daemon alone
    assert command_for(None, ["a"], None) is None  # unknowable without the image


# -- the target container -------------------------------------------------------------
def _pod(ann: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    spec.setdefault(
        "containers",
        [{"name": "main", "image": "127.0.0.1:5000/app:1"}, {"name": "side", "image": "s"}],
    )
    md: dict[str, Any] = {"generateName": "p-", "labels": {LABEL_SANDBOX: "true"}}
    if ann:
        md["annotations"] = ann
    return {"metadata": md, "spec": spec}


def test_target_by_annotation_then_default_container_then_first() -> None:
    assert target_index(_pod()) == (0, [])
    assert target_index(_pod({ANN_DEFAULT_CONTAINER: "side"})) == (1, [])
    assert target_index(_pod({ANN_CONTAINER: "main", ANN_DEFAULT_CONTAINER: "side"})) == (0, [])
    idx, warnings = target_index(_pod({ANN_DEFAULT_CONTAINER: "gone"}))
    assert idx == 0 and "names no container; the daemon goes into the first one" in warnings[0]
    with pytest.raises(RewriteError, match="names no container"):
        target_index(_pod({ANN_CONTAINER: "gone"}))


def test_image_to_resolve_only_without_a_command() -> None:
    assert image_to_resolve(_pod()) == "127.0.0.1:5000/app:1"
    assert image_to_resolve(_pod({ANN_DEFAULT_CONTAINER: "side"})) == "s"
    with_cmd = _pod(containers=[{"name": "m", "image": "i", "command": ["x"]}])
    assert image_to_resolve(with_cmd) is None


# -- lifetime --------------------------------------------------------------------------
def _owned(kind: str, api: str, controller: bool = True) -> dict[str, Any]:
    p = _pod()
    ref = {"apiVersion": api, "kind": kind, "name": "o", "uid": "u", "controller": controller}
    p["metadata"]["ownerReferences"] = [ref]
    return p


@pytest.mark.parametrize(
    ("pod", "default", "expected"),
    [
        (_owned("Job", "batch/v1"), "owner", True),  # Jobs, and so CronJobs
        (_owned("Workflow", "argoproj.io/v1alpha1"), "owner", True),
        (_owned("TaskRun", "tekton.dev/v1"), "owner", True),
        (_owned("PyTorchJob", "kubeflow.org/v1"), "owner", True),
        (_owned("ReplicaSet", "apps/v1"), "owner", False),  # Deployments
        (_owned("StatefulSet", "apps/v1"), "owner", False),
        (_owned("Job", "example.com/v1"), "owner", False),  # someone else's "Job"
        (_pod(), "owner", False),  # bare pods keep the sandbox
        (_pod(), "always", True),
        (_owned("Job", "batch/v1"), "never", False),
        (_pod({ANN_EXIT_WITH_COMMAND: "true"}), "never", True),  # the annotation wins
        (
            _pod(
                {ANN_EXIT_WITH_COMMAND: "false"},
            ),
            "always",
            False,
        ),
    ],
)
def test_exit_with_command(pod: dict[str, Any], default: str, expected: bool) -> None:
    assert exits_with_command(pod, default) is expected


def test_exit_with_command_annotation_is_strict() -> None:
    with pytest.raises(RewriteError, match='must be "true" or "false"'):
        exits_with_command(_pod({ANN_EXIT_WITH_COMMAND: "yes"}), "owner")


# -- readiness ---------------------------------------------------------------------------
def test_no_probe_means_the_daemon_accepts_commands() -> None:
    probe, flag, warnings = readiness({"name": "m"}, 7878)
    assert probe["httpGet"] == {"path": "/healthz", "port": 7878} and flag is None
    assert warnings == []


def test_an_existing_probe_is_combined_through_readyz() -> None:
    c = {
        "name": "m",
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http"},
            "initialDelaySeconds": 2,
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 4,
        },
    }
    probe, flag, warnings = readiness(c, 7878)
    # the kubelet keeps the original's timing; its timeout gets 1 s for the hop (3 + 1)
    assert probe == {
        "httpGet": {"path": "/readyz", "port": 7878},
        "timeoutSeconds": 4,
        "initialDelaySeconds": 2,
        "periodSeconds": 5,
        "failureThreshold": 4,
    }
    # the daemon gets the original probe, with its named port resolved
    assert flag is not None
    assert json.loads(flag)["httpGet"] == {"path": "/ready", "port": 8080}
    assert json.loads(flag)["periodSeconds"] == 5 and warnings == []


def test_probes_that_cannot_be_combined() -> None:
    _, flag, warnings = readiness({"name": "m", "readinessProbe": {"grpc": {"port": 9}}}, 7878)
    assert flag is None and "gRPC readinessProbe cannot be combined" in warnings[0]
    bad_port = {"name": "m", "readinessProbe": {"tcpSocket": {"port": "nope"}}}
    with pytest.raises(RewriteError, match="names port 'nope'"):
        readiness(bad_port, 7878)


# -- scheduler -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("asked", "choice", "expected"),
    [
        (None, "sandman", "sandman-scheduler"),
        ("default-scheduler", "sandman", "sandman-scheduler"),
        ("volcano", "sandman", None),  # a third scheduler is kept under every choice
        (None, "pod", None),
        ("sandman-scheduler", "pod", None),
        (None, "default", None),  # unset already means the default scheduler
        ("sandman-scheduler", "default", "default-scheduler"),
        ("volcano", "default", None),
    ],
)
def test_scheduler_choice(asked: str | None, choice: str, expected: str | None) -> None:
    assert scheduler_for(asked, choice, "sandman-scheduler") == expected


# -- through mutate() -----------------------------------------------------------------------
NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)
SETTINGS = InjectionSettings(daemon_image="127.0.0.1:5000/sandman/daemon:t", version="9.9")


def _mutate(p: dict[str, Any], rule: RuleSet, images: dict[str, ImageFacts] | None) -> Any:
    m = mutate(
        p,
        rule=rule,
        settings=SETTINGS,
        now=NOW,
        new_id=lambda: "abc123",
        token_hash_for=lambda sid: "h" * 64,
        images=images,
    )
    return apply(p, m.patch), m


def test_the_image_entrypoint_runs_under_the_daemon() -> None:
    img = "127.0.0.1:5000/app:1"
    facts = {img: ImageFacts(img, IMAGE, digest="sha256:" + "d" * 64)}
    p = _pod()
    p["spec"]["containers"][0]["args"] = ["a"]
    out, m = _mutate(p, RuleSet(name="r"), facts)
    c = out["spec"]["containers"][0]
    assert c["command"] == [*DAEMON, "--", "/entry.sh", "--flag", "a"] and "args" not in c
    assert m.warnings == [] and m.image_digest == "sha256:" + "d" * 64
    # the pod says where its command came from
    ann = out["metadata"]["annotations"]
    assert ann["sandman.dev/entrypoint-from"] == f"{img}@sha256:" + "d" * 64
    assert "command" not in out["spec"]["containers"][1]  # other containers run as they were


@pytest.mark.parametrize("mode", ["enforce", "warn", "audit"])
def test_an_unreadable_image_is_denied_in_enforce_and_stated_otherwise(mode: str) -> None:
    img = "127.0.0.1:5000/app:1"
    facts = {img: ImageFacts(img, error="127.0.0.1:5000 unreachable: connection refused")}
    rule = RuleSet(name="team", mode=mode)
    if mode == "enforce":
        with pytest.raises(MutationError, match=r"\[image-config\].*connection refused") as e:
            _mutate(_pod(), rule, facts)
        assert e.value.rule == "image-config" and "fix: set `command`" in str(e.value)
        return
    out, m = _mutate(_pod(), rule, facts)
    assert out["spec"]["containers"][0]["command"] == [*DAEMON, "--"]
    assert any("could not be read" in w and "only the daemon runs" in w for w in m.warnings)


def test_a_stale_config_runs_with_a_warning_that_says_so() -> None:
    img = "127.0.0.1:5000/app:1"
    note = "its registry failed (unreachable); used the ENTRYPOINT/CMD last read for sha256:d"
    out, m = _mutate(
        _pod(), RuleSet(name="r"), {img: ImageFacts(img, IMAGE, "sha256:d", note=note)}
    )
    assert out["spec"]["containers"][0]["command"][-4:] == [
        "/entry.sh",
        "--flag",
        "serve",
        "$$(HOME)",
    ]
    assert m.warnings == [f"container main: {note}"]


def test_job_pods_exit_with_their_command() -> None:
    p = _owned("Job", "batch/v1")
    p["spec"]["containers"][0]["command"] = ["sh", "-c", "exit 3"]
    out, _ = _mutate(p, RuleSet(name="r"), {})
    assert out["spec"]["containers"][0]["command"] == [
        *DAEMON,
        "--exit-with-command",
        "--",
        "sh",
        "-c",
        "exit 3",
    ]
    # nothing to exit with: the flag is not passed, and the warning says so
    p["spec"]["containers"][0].pop("command")
    out, m = _mutate(p, RuleSet(name="r"), None)
    assert "--exit-with-command" not in out["spec"]["containers"][0]["command"]
    assert any("no command to exit with" in w for w in m.warnings)


def test_scheduler_choice_comes_from_the_rule() -> None:
    for choice, expected in (("sandman", "sandman-scheduler"), ("pod", None), ("default", None)):
        out, _ = _mutate(_pod(), dataclasses.replace(RuleSet(name="r"), scheduler=choice), None)
        assert out["spec"].get("schedulerName") == expected


def test_policy_fields_are_read_strictly() -> None:
    from sandman.webhook.policy import PolicyError, parse_policy

    doc = {"rules": [{"name": "a", "scheduler": "default", "exitWithCommand": "always"}]}
    rule = parse_policy(doc).rules[0]
    assert (rule.scheduler, rule.exit_with_command) == ("default", "always")
    assert (RuleSet(name="d").scheduler, RuleSet(name="d").exit_with_command) == (
        "sandman",
        "owner",
    )
    for bad in ({"scheduler": "volcano"}, {"exitWithCommand": True}):
        with pytest.raises(PolicyError):
            parse_policy({"rules": [{"name": "b", **bad}]})
