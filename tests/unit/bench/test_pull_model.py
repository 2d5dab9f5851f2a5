"""The placement study's pull model: serial pulls, shared fetches, LRU disk."""

from __future__ import annotations

from sandman.bench.extender_model import GB, PullModel, Sandbox

# 1 GB/s so that a pull of N GB takes N seconds; 2 s start with the image present.
MODEL = {"disk": 4 * GB, "bandwidth": GB, "start_s": 2.0}


def sb(idx: int, image: str, gb: int) -> Sandbox:
    return Sandbox(idx, image, gb * GB, 0.0, node="n1")


def test_pulls_on_one_node_are_serial_and_a_second_pod_joins_the_pull() -> None:
    m = PullModel(["n1"], **MODEL)
    a, b, a2 = sb(0, "a", 2), sb(1, "b", 1), sb(2, "a", 2)
    # a: pull 0 -> 2 s, ready at 2 + 2 = 4
    assert m.place(a, "n1", now=0.0) == 2.0 and a.ready == 4.0
    # b waits for the puller: 2 -> 3 s, ready at 3 + 2 = 5
    assert m.place(b, "n1", now=0.0) == 3.0 and b.ready == 5.0
    # a2 joins a's pull: no new pull, ready when it ends: 2 + 2 = 4
    assert m.place(a2, "n1", now=1.0) is None and a2.ready == 4.0 and a2.waited_for_pull
    assert (m.nodes["n1"].pulls, m.nodes["n1"].bytes_pulled) == (2, 3 * GB)


def test_an_image_on_disk_starts_without_a_pull() -> None:
    m = PullModel(["n1"], **MODEL)
    m.pulled("n1", "a", 2 * GB)
    s = sb(0, "a", 2)
    # on disk: ready at now + start = 10 + 2
    assert m.place(s, "n1", now=10.0) is None and s.ready == 12.0 and not s.waited_for_pull


def test_a_completed_pull_evicts_least_recently_used_images_not_in_use() -> None:
    m = PullModel(["n1"], **MODEL)
    m.pulled("n1", "old", 2 * GB)
    m.pulled("n1", "used", 1 * GB)
    m.place(sb(0, "used", 1), "n1", now=0.0)  # in use: never evicted
    # disk 4 GB holds 3; 2 more need 1 freed: "old" (unused, LRU) goes
    m.pulled("n1", "new", 2 * GB)
    assert list(m.nodes["n1"].disk) == ["used", "new"] and m.nodes["n1"].evictions == 1
    # 4 GB next to 3 GB: evict "new" (unused) -> 1 GB left, 1 + 4 > 4 and the
    # rest is in use: the disk overflows (counted), the image is kept
    m.pulled("n1", "big", 4 * GB)
    node = m.nodes["n1"]
    assert (node.evictions, node.overflows, list(node.disk)) == (2, 1, ["used", "big"])
