"""The development harness: the local cluster, image building and test-bed helpers.

Not part of the SDK or the components: it starts upstream binaries, builds
images and runs the tiers of tests and benchmarks. Installed with the `dev`
extra; nothing under ``sandman.client``, ``sandman.daemon`` or the components
imports it.
"""
