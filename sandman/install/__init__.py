"""Installing Sandman on a cluster: image names, the kustomize overlay, install and uninstall.

Standard library only (plus PyYAML), so that `pip install sandman-k8s` is
enough to install Sandman from the manifests shipped as package data
(``sandman.manifests``); building the images needs the repository and the
harness (`sandman image build/push`).
"""
