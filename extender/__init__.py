"""kube-scheduler extender scoring nodes by image-cache presence."""
