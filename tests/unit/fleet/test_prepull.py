"""Which problems' images a fleet pre-pulls, and which of those it skips (pure)."""

from __future__ import annotations

from sandman.contract import LABEL_RUN, SCHEDULER_NAME
from sandman.fleet.prepull import Where, choose_images, choose_problems, prepull_pod, started

# 8 problems, 4 rollouts each; problem 0 has begun (2 left), the rest not.
REMAINING = [2, 4, 4, 4, 4, 4, 4, 4]
BEGUN = [True] + [False] * 7


def test_none_pre_pulls_the_next_problems_not_yet_begun() -> None:
    # Nothing is warm under `none`; problem 0 is pulling through its own pods.
    assert choose_problems("none", 2, REMAINING, BEGUN, ahead=3) == [1, 2, 3]


def test_pipelined_pre_pulls_after_the_two_warm_blocks() -> None:
    # window 2: the front is in block 0 (problems 0-1), block 1 (2-3) warms:
    # both are warm, so the pre-pull starts at problem 4.
    assert choose_problems("pipelined", 2, REMAINING, BEGUN, ahead=2) == [4, 5]


def test_sliding_pre_pulls_after_its_window_and_skips_finished_problems() -> None:
    remaining = [0, 0, 3, 4, 4, 4, 4, 4]  # problems 0 and 1 are done
    begun = [True, True, True] + [False] * 5
    # open: 2..7; sliding window 3 warms 2, 3, 4; then 5, 6.
    assert choose_problems("sliding", 3, remaining, begun, ahead=2) == [5, 6]


def test_naive_warms_everything_so_nothing_is_left_to_pre_pull() -> None:
    assert choose_problems("naive", 2, REMAINING, BEGUN, ahead=4) == []


def test_off_and_near_the_end() -> None:
    assert choose_problems("none", 2, REMAINING, BEGUN, ahead=0) == []
    assert choose_problems("none", 2, [0] * 7 + [4], [True] * 7 + [False], ahead=3) == [7]


def test_images_held_or_pulling_somewhere_or_asked_before_are_skipped() -> None:
    where = {
        "held": Where(holders=1, pulling=0),  # the extender places its pods there already
        "pulling": Where(holders=0, pulling=2),  # a node is fetching it now
        "nowhere": Where(holders=0, pulling=0),
        # "unknown": no answer (extender down): pre-pulled anyway
    }
    images = ["held", "pulling", "nowhere", "unknown", "nowhere", "asked"]
    assert choose_images(images, where, asked={"asked"}) == ["nowhere", "unknown"]


def test_where_reads_the_extender_answer() -> None:
    doc = {"holders": [{"node": "n1", "evidence": ["observed"]}], "pulling": []}
    assert Where.from_answer(doc) == Where(1, 0)


def test_the_pre_pull_pod_is_a_plain_pod_through_sandman_scheduler() -> None:
    pod = prepull_pod(
        "127.0.0.1:5000/task:a",
        "abc123",
        node_selector={"k": "v"},
        tolerations=[{"key": "t", "operator": "Exists"}],
    )
    spec = pod["spec"]
    assert spec["schedulerName"] == SCHEDULER_NAME  # so the extender chooses the node
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] > 0
    assert spec["containers"][0]["command"] == ["true"]
    assert spec["nodeSelector"] == {"k": "v"} and spec["tolerations"][0]["key"] == "t"
    # not a sandbox: the webhook leaves it alone; the run label finds it
    assert pod["metadata"]["labels"] == {LABEL_RUN: "abc123"}


def test_started_means_the_node_has_the_image() -> None:
    assert not started({"status": {"phase": "Pending"}})
    waiting = {"state": {"waiting": {"reason": "ContainerCreating"}}}
    assert not started({"status": {"phase": "Pending", "containerStatuses": [waiting]}})
    assert started({"status": {"phase": "Succeeded"}})
    ran = {"state": {"terminated": {"exitCode": 127}}}  # no `true` in it: pulled all the same
    assert started({"status": {"phase": "Pending", "containerStatuses": [ran]}})
    stuck = {"state": {"waiting": {"reason": "CreateContainerError"}}}  # pulled, cannot run
    assert started({"status": {"phase": "Pending", "containerStatuses": [stuck]}})
    pulling = {"state": {"waiting": {"reason": "ErrImagePull"}}}
    assert not started({"status": {"phase": "Pending", "containerStatuses": [pulling]}})
