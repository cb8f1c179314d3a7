"""The Kubernetes provider plugin: pilot pods in an existing cluster (providers/kubernetes/README.md)."""
