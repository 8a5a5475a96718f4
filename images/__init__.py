"""Kiln's OS image catalogue (``catalog.yaml``) and what provisioning reads from it."""
