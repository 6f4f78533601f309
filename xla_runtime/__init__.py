"""xla_runtime: compiled multi-step XLA loops over a device mesh (see docs/architecture.md)."""
