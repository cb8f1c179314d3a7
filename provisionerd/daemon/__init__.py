"""The composition root that builds and wires the daemon's parts, its admin socket, its orphan cycles."""
