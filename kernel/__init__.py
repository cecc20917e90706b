"""The shared kernel: errors, stored sentences, units, throttles, caches, wake-ups, the object store and
Kubernetes clients, paths, process trees. It imports no app of the platform (the contracts in pyproject.toml)."""
