"""The image index: facts from node lists, pod observations and assumptions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sandman.extender.index import ImageIndex
from sandman.extender.limits import IndexLimits
from sandman.extender.observe import ContainerImage, ImageEntry, NodeReport, PodReport
from sandman.extender.score import NodeFacts

GB = 10**9
D = "sha256:" + "ab" * 32
D2 = "sha256:" + "cd" * 32
REG = "127.0.0.1:5000"
TASK = f"{REG}/swe/task:v1"
OTHER = f"{REG}/swe/other:v1"


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def index(clock: Clock, **limits: object) -> ImageIndex:
    return ImageIndex(clock=clock, limits=IndexLimits(**limits))  # type: ignore[arg-type]


def report(node: str, *entries: tuple[tuple[str, ...], int]) -> NodeReport:
    return NodeReport(node, tuple(ImageEntry(names, size) for names, size in entries))


def pod(
    uid: str, node: str, *images: tuple[str, str], image_id: str = "", active: bool = True
) -> PodReport:
    return PodReport(
        uid, node, tuple(ContainerImage(ref, st, image_id) for ref, st in images), active
    )


def holders(ix: ImageIndex, image: str) -> dict[str, tuple[str, ...]]:
    w = ix.where(image)
    assert w is not None
    return w.holders


def test_short_name_matches_the_fully_qualified_names_a_kubelet_reports(clock: Clock) -> None:
    ix = index(clock)
    ix.update_node(
        report("n1", ((f"docker.io/library/nginx@{D}", "docker.io/library/nginx:latest"), 3 * GB))
    )
    assert holders(ix, "nginx") == {"n1": ("reported",)}
    assert holders(ix, f"nginx@{D}") == {"n1": ("reported",)}
    w = ix.where("nginx:latest")
    assert w is not None and w.size == 3 * GB and w.key == "docker.io/library/nginx:latest"
    assert holders(ix, "nginx:1.25") == {}


def test_tag_matches_a_node_listing_only_the_digest(clock: Clock) -> None:
    ix = index(clock)
    # n1 lists only the digest; n2's entry says the tag is that digest.
    ix.update_node(report("n1", ((f"{REG}/swe/task@{D}",), 3 * GB)))
    assert holders(ix, TASK) == {}
    ix.update_node(report("n2", ((f"{REG}/swe/task@{D}", TASK), 3 * GB)))
    assert set(holders(ix, TASK)) == {"n1", "n2"}


def test_same_digest_under_another_repository_is_the_same_content(clock: Clock) -> None:
    ix = index(clock)
    ix.update_node(report("n1", ((f"{REG}/mirror/task@{D}",), 2 * GB)))
    assert set(holders(ix, f"{REG}/swe/task@{D}")) == {"n1"}


def test_sizes_learned_from_any_node(clock: Clock) -> None:
    ix = index(clock)
    ix.update_pod(pod("u1", "n1", (TASK, "pending")))
    # Unknown size: the default (1 GiB) stands in.
    assert ix.pod_facts([TASK]).total == 1 << 30
    ix.update_node(report("n2", ((TASK,), 3 * GB)))
    facts = ix.pod_facts([TASK])
    assert facts.total == 3 * GB and facts.needs[0].size_known


def test_pending_is_pulling_started_is_held_gone_stays_observed(clock: Clock) -> None:
    ix = index(clock)
    ix.update_node(report("n1", ((TASK,), 3 * GB)))  # for the size
    ix.update_pod(pod("u1", "n2", (TASK, "pending")))
    w = ix.where(TASK)
    assert w is not None and w.pulling == {"n2": 1} and set(w.holders) == {"n1"}
    ix.update_pod(pod("u1", "n2", (TASK, "started")))
    assert holders(ix, TASK)["n2"] == ("running", "observed")
    ix.remove_pod("u1")
    assert holders(ix, TASK)["n2"] == ("observed",)
    w = ix.where(TASK)
    assert w is not None and w.pulling == {}


def test_failed_pull_is_neither(clock: Clock) -> None:
    ix = index(clock)
    ix.update_pod(pod("u1", "n2", (TASK, "failed")))
    w = ix.where(TASK)
    assert w is not None and w.pulling == {} and w.holders == {}


def test_image_id_teaches_the_tag_its_digest(clock: Clock) -> None:
    ix = index(clock)
    ix.update_pod(pod("u1", "n1", (TASK, "started"), image_id=f"{REG}/swe/task@{D}"))
    ix.update_node(report("n2", ((f"{REG}/swe/task@{D}",), 3 * GB)))
    assert set(holders(ix, TASK)) == {"n1", "n2"}
    assert set(holders(ix, f"{REG}/other-name@{D}")) == {"n1", "n2"}


def test_untruncated_list_refutes_an_old_observation(clock: Clock) -> None:
    ix = index(clock, report_lag_s=60.0)
    ix.update_pod(pod("u1", "n1", (TASK, "started")))
    ix.remove_pod("u1")
    # A list from 59 s later may simply not include the new image yet.
    clock.now += 59
    ix.update_node(report("n1", ((OTHER,), GB)))
    assert "n1" in holders(ix, TASK)
    # At 60 s it counts as proof: the list is complete (1 < 50 images).
    clock.now += 1
    ix.update_node(report("n1", ((OTHER,), GB)))  # unchanged list: still re-checked
    assert holders(ix, TASK) == {}


def test_a_list_too_recent_to_refute_refutes_once_the_lag_has_passed(clock: Clock) -> None:
    """A kubelet posts its image list only when it changes: the list that came
    10 s after the image was removed is the last one for minutes, and must
    still refute the observation once the lag has passed (seen in `sandman
    bench rollout`: removed images were placed on the node for minutes)."""
    ix = index(clock, report_lag_s=60.0)
    ix.update_pod(pod("u1", "n1", (TASK, "started")))
    ix.remove_pod("u1")
    clock.now += 10
    ix.update_node(report("n1", ((OTHER,), GB)))
    assert "n1" in holders(ix, TASK)  # too soon: the list may lag the pull
    clock.now += 49
    assert "n1" in holders(ix, TASK)
    clock.now += 1  # no new list, only time
    assert holders(ix, TASK) == {}


def test_a_node_that_lists_no_images_refutes_nothing_by_time_alone(clock: Clock) -> None:
    ix = index(clock, report_lag_s=60.0)
    ix.update_pod(pod("u1", "n1", (TASK, "started")))
    ix.remove_pod("u1")
    clock.now += 10
    ix.update_node(report("n1"))  # kwok: no status.images at all
    clock.now += 600  # (observations expire after 30 min)
    assert holders(ix, TASK)["n1"] == ("observed",)


def test_running_pod_is_evidence_the_list_cannot_refute(clock: Clock) -> None:
    ix = index(clock)
    ix.update_pod(pod("u1", "n1", (TASK, "started")))
    clock.now += 3600
    ix.update_node(report("n1", ((OTHER,), GB)))
    assert holders(ix, TASK)["n1"] == ("running",)


def test_truncated_list_refutes_only_images_bigger_than_its_smallest(clock: Clock) -> None:
    ix = index(clock, node_status_max_images=2)
    ix.update_node(report("n9", ((TASK,), 3 * GB), ((f"{REG}/small:1",), GB // 10)))
    for uid, image in (("u1", TASK), ("u2", f"{REG}/small:1")):
        ix.update_pod(pod(uid, "n1", (image, "started")))
        ix.remove_pod(uid)
    clock.now += 120
    # Two images listed (= the maximum): truncated, sorted largest first, the
    # smallest listed is 2 GB. TASK (3 GB) would have been listed: it is gone.
    # small:1 (0.1 GB) may be beyond the cut: kept.
    ix.update_node(report("n1", ((f"{REG}/a:1",), 4 * GB), ((f"{REG}/b:1",), 2 * GB)))
    assert holders(ix, TASK).keys() == {"n9"}
    assert holders(ix, f"{REG}/small:1").keys() == {"n1", "n9"}


def test_observations_expire(clock: Clock) -> None:
    ix = index(clock, observed_ttl_s=1800.0)
    ix.update_pod(pod("u1", "n1", (TASK, "started")))
    ix.remove_pod("u1")
    clock.now += 1799
    assert "n1" in holders(ix, TASK)
    clock.now += 1
    assert holders(ix, TASK) == {}


def test_assumed_placement_until_the_watch_or_the_ttl(clock: Clock) -> None:
    ix = index(clock, assume_ttl_s=30.0)
    ix.assume("u1", "n1", [TASK])
    w = ix.where(TASK)
    assert w is not None and w.pulling == {"n1": 1}
    assert ix.stats().assumed == 1 and not ix.knows_pod("u1")
    # The binding arrives: on another node. The assumption is replaced.
    ix.update_pod(pod("u1", "n2", (TASK, "pending")))
    w = ix.where(TASK)
    assert w is not None and w.pulling == {"n2": 1} and ix.stats().assumed == 0
    # A known pod is never re-assumed elsewhere.
    ix.assume("u1", "n3", [TASK])
    w = ix.where(TASK)
    assert w is not None and w.pulling == {"n2": 1}
    # An assumption nobody confirms expires.
    ix.assume("u2", "n4", [TASK])
    clock.now += 29.9
    w = ix.where(TASK)
    assert w is not None and "n4" in w.pulling
    clock.now += 0.1
    w = ix.where(TASK)
    assert w is not None and "n4" not in w.pulling and ix.stats().assumed == 0


def test_pod_facts(clock: Clock) -> None:
    ix = index(clock)
    daemon = f"{REG}/sandman/daemon:1"
    ix.update_node(report("n1", ((TASK,), 3 * GB), ((daemon,), 20_000_000)))
    ix.update_node(report("n2", ((daemon,), 20_000_000), ((OTHER,), 2 * GB)))
    ix.update_pod(pod("p1", "n1", (TASK, "started"), (daemon, "started")))
    ix.update_pod(pod("p2", "n3", (TASK, "pending")))
    ix.update_pod(pod("p3", "n3", (OTHER, "pending")))  # another image in flight on n3
    ix.update_pod(pod("p4", "n2", (f"{REG}/x:1", "pending")))  # and on n2
    ix.update_pod(pod("p5", "n2", (OTHER, "pending")))  # n2 holds OTHER: no pull
    f = ix.pod_facts([TASK, daemon])
    assert f.total == 3 * GB + 20_000_000
    assert f.primary == TASK
    assert f.facts == {
        # holds both; one pod of TASK
        "n1": NodeFacts(3 * GB + 20_000_000, 0, 0, 1),
        # holds the daemon; pulling x:1 for someone else (OTHER is held there)
        "n2": NodeFacts(20_000_000, 0, 1, 0),
        # pulling TASK (one pod) and OTHER
        "n3": NodeFacts(0, 3 * GB, 1, 1),
    }
    assert ix.pod_facts([]).facts == {} and ix.pod_facts(["NOT A REF"]).total == 0


def test_terminal_pods_do_not_crowd(clock: Clock) -> None:
    ix = index(clock)
    ix.update_pod(pod("p1", "n1", (TASK, "started"), active=False))
    assert ix.pod_facts([TASK]).facts["n1"].same_image_pods == 0


def test_bounded_names_and_observations(clock: Clock) -> None:
    ix = index(clock, max_image_names=3, max_observations=2)
    ix.update_node(report("n1", *(((f"{REG}/i{k}:1",), GB * (k + 1)) for k in range(5))))
    assert ix.stats().image_names == 3
    # The least recently reported names lost their sizes; the rest kept theirs.
    assert ix.pod_facts([f"{REG}/i0:1"]).needs[0].size_known is False
    assert ix.pod_facts([f"{REG}/i4:1"]).needs[0].size == 5 * GB
    for k in range(3):
        ix.update_pod(pod(f"u{k}", "n2", (f"{REG}/j{k}:1", "started")))
        ix.remove_pod(f"u{k}")
    assert holders(ix, f"{REG}/j0:1") == {}
    assert holders(ix, f"{REG}/j2:1") == {"n2": ("observed",)}


def test_node_removal_forgets_its_images(clock: Clock) -> None:
    ix = index(clock)
    ix.update_node(report("n1", ((TASK,), 3 * GB)))
    ix.update_pod(pod("u1", "n1", (OTHER, "started")))
    ix.remove_node("n1")
    assert holders(ix, TASK) == {} and holders(ix, OTHER) == {}
    ix.remove_pod("u1")  # after its node: no record is resurrected
    assert ix.stats().nodes == 0


def test_a_moved_tag_follows_the_last_report(clock: Clock) -> None:
    ix = index(clock)
    ix.update_node(report("n1", ((f"{REG}/swe/task@{D}", TASK), 3 * GB)))
    # The tag is re-pushed: n2 lists it next to a new digest; a node holding
    # only the new digest now matches the tag, one holding only the old does not.
    ix.update_node(report("n2", ((f"{REG}/swe/task@{D2}", TASK), 3 * GB)))
    ix.update_node(report("n3", ((f"{REG}/swe/task@{D2}",), 3 * GB)))
    ix.update_node(report("n4", ((f"{REG}/swe/task@{D}",), 3 * GB)))
    assert set(holders(ix, TASK)) == {"n1", "n2", "n3"}
