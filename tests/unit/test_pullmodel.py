"""The kwok pull model (harness/cluster/pullmodel.py): when a pod can start on a node."""

from __future__ import annotations

import pytest

from sandman.harness.cluster.kwok_pull import pod_images, pod_stages, rfc3339
from sandman.harness.cluster.pullmodel import PullModel

A, B = "127.0.0.1:5000/task:a", "127.0.0.1:5000/task:b"
MB = 1_000_000


def model() -> PullModel:
    # 100 MB/s: A (300 MB) takes 3 s, B (100 MB) 1 s; anything else is free.
    return PullModel(rate_bytes_per_s=100 * MB, sizes={A: 300 * MB, B: 100 * MB})


def test_a_node_without_the_image_pulls_it_size_over_rate() -> None:
    m = model()
    plan = m.plan("n1", [A], now=10.0)
    assert plan.ready_at == pytest.approx(13.0)  # 10 + 300 MB / 100 MB/s
    assert plan.pulled == (A,)
    assert not m.holds("n1", A, 12.9) and m.holds("n1", A, 13.0)


def test_a_node_that_holds_the_image_starts_the_pod_at_once() -> None:
    m = model()
    m.hold("n1", [A])  # status.images lists it
    assert m.plan("n1", [A], now=10.0).ready_at == 10.0
    m.plan("n2", [A], now=0.0)  # a pod ran there: pulled by t=3
    plan = m.plan("n2", [A], now=5.0)
    assert plan.ready_at == 5.0 and plan.pulled == () and plan.waited_on == ()


def test_a_second_pod_waits_for_the_pull_in_progress_not_a_new_one() -> None:
    m = model()
    m.plan("n1", [A], now=0.0)  # pull ends at 3
    plan = m.plan("n1", [A], now=1.0)
    assert plan.ready_at == pytest.approx(3.0)  # the same pull, not 1 + 3
    assert plan.waited_on == (A,) and plan.pulled == ()


def test_pulls_on_one_node_queue_and_nodes_are_independent() -> None:
    m = model()
    m.plan("n1", [A], now=0.0)  # link busy until 3
    # B queues behind A on n1: 3 + 1 = 4; on n2 the link is free: 0.5 + 1.
    assert m.plan("n1", [B], now=0.5).ready_at == pytest.approx(4.0)
    assert m.plan("n2", [B], now=0.5).ready_at == pytest.approx(1.5)


def test_a_pod_with_several_images_waits_for_the_last_and_unknown_sizes_are_free() -> None:
    m = model()
    daemon = "127.0.0.1:5000/sandman/daemon:dev"  # unknown size: default 0 bytes
    plan = m.plan("n1", [daemon, A, B, A], now=0.0)
    assert plan.ready_at == pytest.approx(4.0)  # A then B: 3 + 1; A counted once
    assert plan.pulled == (A, B)
    assert m.holds("n1", daemon, 0.0)


def test_bad_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="pull rate"):
        PullModel(rate_bytes_per_s=0)


def test_the_stage_waits_for_the_annotation_and_delays_until_its_time() -> None:
    ready = next(s for s in pod_stages() if s["metadata"]["name"] == "pod-ready-after-pull")
    keys = [e["key"] for e in ready["spec"]["selector"]["matchExpressions"]]
    assert '.metadata.annotations["pull.stage.kwok.x-k8s.io/ready-at"]' in keys
    assert ready["spec"]["delay"]["durationFrom"]["expressionFrom"].endswith('ready-at"]')
    assert rfc3339(0.25) == "1970-01-01T00:00:00.250000Z"  # what kwok parses (RFC 3339 nano)
    pod = {"spec": {"initContainers": [{"image": "d"}], "containers": [{"image": A}, {}]}}
    assert pod_images(pod) == ["d", A]
