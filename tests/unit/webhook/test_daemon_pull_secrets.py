"""Sandboxes name the daemon image's pull Secrets where they pull it (applied and checked)."""

from __future__ import annotations

import argparse
import dataclasses

from sandman.webhook import config as webhook_config
from sandman.webhook.mutate import INIT_CONTAINER, InjectionSettings
from tests.unit.webhook.test_mutate import SETTINGS, injected, pod

PRIVATE = dataclasses.replace(SETTINGS, daemon_pull_secrets=("sandman-pull", "second"))


def test_a_sandbox_with_an_install_step_names_the_secrets() -> None:
    out, _ = injected(pod(), settings=PRIVATE)
    assert out["spec"]["imagePullSecrets"] == [{"name": "sandman-pull"}, {"name": "second"}]
    assert out["spec"]["initContainers"][0]["name"] == INIT_CONTAINER


def test_the_pods_own_secrets_stay_first_and_none_is_named_twice() -> None:
    mine = [{"name": "task-images"}, {"name": "second"}]
    out, _ = injected(pod(imagePullSecrets=mine), settings=PRIVATE)
    assert out["spec"]["imagePullSecrets"] == [*mine, {"name": "sandman-pull"}]


def test_shared_delivery_pulls_the_image_too() -> None:
    shared = dataclasses.replace(PRIVATE, daemon_delivery="shared")
    out, _ = injected(pod(), settings=shared)
    assert out["spec"]["imagePullSecrets"] == [{"name": "sandman-pull"}, {"name": "second"}]


def test_node_delivery_pulls_nothing_in_the_sandbox_namespace() -> None:
    node = dataclasses.replace(PRIVATE, daemon_delivery="node", node_installer=True)
    out, _ = injected(pod(), settings=node)
    assert "imagePullSecrets" not in out["spec"]
    assert "initContainers" not in out["spec"]


def test_without_the_flag_nothing_changes() -> None:
    assert InjectionSettings(daemon_image="d", version="1").daemon_pull_secrets == ()
    out, _ = injected(pod())
    assert "imagePullSecrets" not in out["spec"]


def test_the_webhook_flag_repeats() -> None:
    parser = argparse.ArgumentParser()
    webhook_config.add_flags(parser)
    args = parser.parse_args(
        ["--daemon-image=d", "--daemon-pull-secret=a", "--daemon-pull-secret=b"]
    )
    assert webhook_config.from_args(args).daemon_pull_secrets == ("a", "b")
