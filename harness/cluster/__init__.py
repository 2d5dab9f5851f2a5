"""The local Kubernetes cluster Sandman runs on and is tested against."""
