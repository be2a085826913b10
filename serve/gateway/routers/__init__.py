"""The gateway's routes: detection, and the service routes (models, health, readiness, metrics)."""
