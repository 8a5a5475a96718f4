"""The fleet dashboard, served on the controller's HTTP port (read-only)."""
