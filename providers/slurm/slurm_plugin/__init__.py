"""The Slurm provider plugin: each machine is a pilot job that runs the worker agent (see ../README.md)."""
