"""Mutations through the gate: the mutation gate, the executor and its flows, the reconcile loop, the orphan cycle."""
