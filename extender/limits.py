"""The image index's tuning knobs: each number, where it comes from, what it costs."""

from __future__ import annotations

from dataclasses import dataclass

# The kubelet's default nodeStatusMaxImages: a node listing this many images
# may have more, so absence from its list proves nothing (except for images
# bigger than the smallest listed: the list is sorted by size, largest first).
NODE_STATUS_MAX_IMAGES = 50
# A new pull reaches node.status.images only after the kubelet's image list
# cache refresh (every 30 s, image_gc_manager.go) and the next status update
# (nodeStatusUpdateFrequency, 10 s): 60 s covers both with margin. Cost: an
# image deleted from a node keeps its credit up to this long after the list
# that lacks it arrives.
REPORT_LAG_S = 60.0
# How long an observation (a pod of image X ran on node N) counts after the
# pod is gone, when the node's list cannot confirm or refute it (kwok nodes,
# truncated lists). Kubelet image GC runs every 5 min once disk use passes
# 85%; a node churning 1-3 GB task images through ~100 GB of image disk
# evicts an unused image in roughly half an hour. Too long costs one cold pull
# where we expected a warm one (what default scheduling pays anyway).
OBSERVED_TTL_S = 1800.0
# How long a placement we predicted (our top-scored node) counts as a pull in
# progress before the watch shows the binding. Scheduling and binding take
# milliseconds to a few seconds under a burst; 30 s is kube-scheduler's
# historic assumed-pod expiry. Cost: a binding that failed leaves a phantom
# pull for up to this long.
ASSUME_TTL_S = 30.0
# Images never reported by any node have no size; the task images Sandman is
# sized for (an SWE problem: repository, toolchain, dependencies; the RL batch of
# docs/extender.md) are 1-3 GB, and the GKE measurement used 1.2 GB, so 1 GiB. Cost: a small
# unknown image looks big, which only makes its pods co-locate more.
DEFAULT_IMAGE_BYTES = 1 << 30
# Memory bounds. 100k image names (sizes, learned digests) at ~300 B each is
# ~30 MB and covers the 10,000 tracked images of the benchmark with their
# aliases; evicting the least recently reported one loses its size (the
# default is used) until a node reports it again.
MAX_IMAGE_NAMES = 100_000
# 200k past observations (node, image) at ~200 B each is ~40 MB: 40 per node
# on 5,000 nodes. The oldest goes first.
MAX_OBSERVATIONS = 200_000
# A kubelet with nodeStatusMaxImages -1 lists everything; keep the largest.
MAX_REPORTED_PER_NODE = 1000


@dataclass(frozen=True)
class IndexLimits:
    node_status_max_images: int = NODE_STATUS_MAX_IMAGES  # -1: lists are never truncated
    report_lag_s: float = REPORT_LAG_S
    observed_ttl_s: float = OBSERVED_TTL_S
    assume_ttl_s: float = ASSUME_TTL_S
    default_image_bytes: int = DEFAULT_IMAGE_BYTES
    max_image_names: int = MAX_IMAGE_NAMES
    max_observations: int = MAX_OBSERVATIONS
    max_reported_per_node: int = MAX_REPORTED_PER_NODE
