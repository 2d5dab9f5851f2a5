"""A pool as a ReplicaSet manifest, and which pool names are allowed."""

from __future__ import annotations

import pytest

from sandman.contract import (
    ANN_IDLE_TIMEOUT,
    ANN_PROFILE,
    ANN_TTL,
    LABEL_POOL,
    LABEL_SANDBOX,
    LABEL_STATE,
)
from sandman.pools.spec import (
    STATE_IDLE,
    PoolSpec,
    check_name,
    pool_selector,
    replicaset_name,
)


def test_selector_is_exactly_pool_and_idle():
    rs = PoolSpec("web", "img:1", size=3, labels={"team": "a"}).replicaset()
    assert rs["spec"]["selector"] == {"matchLabels": {LABEL_POOL: "web", LABEL_STATE: STATE_IDLE}}


def test_template_labels_match_the_selector_and_mark_a_sandbox():
    rs = PoolSpec("web", "img:1", labels={"team": "a"}).replicaset()
    labels = rs["spec"]["template"]["metadata"]["labels"]
    assert labels == {
        "team": "a",
        LABEL_SANDBOX: "true",
        LABEL_POOL: "web",
        LABEL_STATE: STATE_IDLE,
    }
    # the apiserver rejects a ReplicaSet whose selector does not select its template
    assert rs["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_user_labels_cannot_override_pool_state_or_sandbox():
    spec = PoolSpec(
        "web",
        "img:1",
        labels={LABEL_POOL: "other", LABEL_STATE: "claimed", LABEL_SANDBOX: "false"},
    )
    labels = spec.replicaset()["spec"]["template"]["metadata"]["labels"]
    assert labels[LABEL_POOL] == "web"
    assert labels[LABEL_STATE] == STATE_IDLE
    assert labels[LABEL_SANDBOX] == "true"


def test_template_metadata_has_no_name_or_generate_name():
    md = PoolSpec("web", "img:1").replicaset()["spec"]["template"]["metadata"]
    assert "generateName" not in md
    assert "name" not in md


def test_replicaset_shape():
    spec = PoolSpec(
        "web",
        "reg/img:1",
        size=4,
        command=["sleep", "inf"],
        env={"A": "1"},
        ttl="2h",
        profile="rollout",
        node_selector={"zone": "a"},
    )
    rs = spec.replicaset()
    assert rs["apiVersion"] == "apps/v1"
    assert rs["kind"] == "ReplicaSet"
    assert rs["metadata"]["name"] == "pool-web" == replicaset_name("web")
    assert rs["metadata"]["labels"] == {LABEL_POOL: "web"}
    assert rs["metadata"]["annotations"] == {"sandman.dev/pool-image": "reg/img:1"}
    assert rs["spec"]["replicas"] == 4
    assert spec.replicaset(replicas=0)["spec"]["replicas"] == 0
    tmpl = rs["spec"]["template"]
    assert set(tmpl) == {"metadata", "spec"}
    (container,) = tmpl["spec"]["containers"]
    assert container["image"] == "reg/img:1"
    assert container["command"] == ["sleep", "inf"]
    assert container["env"] == [{"name": "A", "value": "1"}]
    assert tmpl["spec"]["nodeSelector"] == {"zone": "a"}
    ann = tmpl["metadata"]["annotations"]
    assert ann[ANN_TTL] == "2h"
    assert ann[ANN_PROFILE] == "rollout"
    assert ANN_IDLE_TIMEOUT not in ann  # idle pool pods must not be reclaimed for idling


def test_replicaset_calls_are_independent():
    spec = PoolSpec("web", "img:1", labels={"team": "a"})
    a = spec.replicaset()
    a["spec"]["template"]["metadata"]["labels"]["x"] = "y"
    a["spec"]["selector"]["matchLabels"]["x"] = "y"
    b = spec.replicaset()
    assert "x" not in b["spec"]["template"]["metadata"]["labels"]
    assert "x" not in b["spec"]["selector"]["matchLabels"]
    assert spec.labels == {"team": "a"}


@pytest.mark.parametrize("name", ["a", "0", "web", "a-b-1", "x" * 52, "a" + "-" * 50 + "b"])
def test_valid_names(name):
    assert check_name(name) == name
    assert PoolSpec(name, "img:1").name == name


@pytest.mark.parametrize(
    "name",
    ["", "Web", "-web", "web-", "we_b", "we.b", "we b", "web/1", "x" * 53, "ünï"],
)
def test_invalid_names_are_rejected_clearly(name):
    with pytest.raises(ValueError, match=r"pool name .* must be lower-case"):
        check_name(name)
    with pytest.raises(ValueError, match="pool name"):
        PoolSpec(name, "img:1")


def test_negative_size_is_rejected():
    with pytest.raises(ValueError, match="size must be >= 0"):
        PoolSpec("web", "img:1", size=-1)
    assert PoolSpec("web", "img:1", size=0).replicaset()["spec"]["replicas"] == 0


def test_pool_selector():
    assert pool_selector("web") == "sandman.dev/pool=web,sandman.dev/state=idle"
    assert pool_selector("web", "claimed") == "sandman.dev/pool=web,sandman.dev/state=claimed"
    assert pool_selector("web", None) == "sandman.dev/pool=web"


def test_trailing_newline_is_rejected():
    with pytest.raises(ValueError, match="pool name"):
        check_name("web\n")
