"""The pure reconciler: given demand, facts, offers, hosts and ``now``, plan actions. No trio, no I/O."""
