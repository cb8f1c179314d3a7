"""The worker agent a machine runs to join the controller with its single-use token."""
