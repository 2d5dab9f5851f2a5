"""Container images built without Docker and pushed to the local registry."""
