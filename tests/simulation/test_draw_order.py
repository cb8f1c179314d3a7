"""Each fault kind added after the first ones is drawn after every earlier kind, with its own chance, so adding it
changes no earlier draw of any seed: the regression seeds replay what they found."""

from __future__ import annotations

import random

import pytest

from provisionerd.testing.simulation import faults
from provisionerd.testing.simulation.faults import KINDS, draw_plan

#: The kinds drawn after the weighted ones, in draw order, with their chances.
LATE = (
    ("twin", faults.TWIN_CHANCE),
    ("storage_failure", faults.STORAGE_FAILURE_CHANCE),
    ("store_loss", faults.STORE_LOSS_CHANCE),
    ("bad_machines", faults.BAD_MACHINES_CHANCE),
    ("reload", faults.RELOAD_CHANCE),
    ("controller_restart", faults.CONTROLLER_RESTART_CHANCE),
    ("foreign_id", faults.FOREIGN_ID_CHANCE),
    ("kill_mid_call", faults.KILL_MID_CALL_CHANCE),
    ("agent_restart", faults.AGENT_RESTART_CHANCE),
)


def test_the_late_kinds_are_every_kind_after_the_weighted_ones_in_draw_order():
    assert KINDS == (*faults.WEIGHTED, *(kind for kind, _ in LATE))


@pytest.mark.parametrize("index", range(len(LATE)), ids=[kind for kind, _ in LATE])
def test_a_late_kind_leaves_every_earlier_draw_as_it_was(index):
    kind, chance = LATE[index]
    later = {k for k, _ in LATE[index + 1 :]}
    with_it = tuple(k for k in KINDS if k not in later)
    without = tuple(k for k in with_it if k != kind)
    drawn = 0
    for seed in range(300):
        args = {"horizon": 200.0, "slots": ("a", "b"), "replicas": 3}
        new = draw_plan(random.Random(seed), kinds=with_it, **args)
        old = draw_plan(random.Random(seed), kinds=without, **args)
        assert tuple(f for f in new.faults if f.kind != kind) == old.faults, seed
        drawn += kind in new.kinds()
    assert 0.6 * chance * 300 <= drawn <= 1.4 * chance * 300, drawn
