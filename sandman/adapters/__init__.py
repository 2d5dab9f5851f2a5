"""Adapters that let existing agent harnesses run on Sandman sandboxes.

Each one is an optional extra, tested against a pinned version of the
harness's own package (docs/adapters.md):

- ``sandman.adapters.swerex``: a SWE-ReX deployment and runtime (``[swerex]``).
- ``sandman.adapters.e2b``: an E2B-compatible HTTP gateway that E2B's own SDK
  is pointed at by environment variables (``sandman e2b-gateway``; ``[e2b]``).
- ``sandman.adapters.gym``: Gymnasium environments over sandboxes (``[gym]``).
"""
