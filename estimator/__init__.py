"""estimator: train, evaluate, predict and export on the compiled loop and the infeed (see docs/architecture.md)."""
