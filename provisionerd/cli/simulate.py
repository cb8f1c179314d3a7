"""``provisionerd simulate``: run a campaign of seeded whole-system simulations (see docs/simulation.md).

    provisionerd simulate --seeds 500 [--start 0] [--jobs 2] [--workload any|gate|lifecycle]
    provisionerd simulate --trace 17          # one seed's whole trace, to read a failure

Prints one JSON line per failing seed (its first violated invariant), then a last line
``{"runs": N, "violations": V, "virtual_hours": H, "wall_s": W}`` where ``V`` is the number of failing seeds.
Exit status 0 when no seed failed, 1 when some did, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Iterator
from typing import Any

import attrs

WORKLOADS = ("any", "gate", "lifecycle")


def _parser() -> argparse.ArgumentParser:
    from provisionerd.testing.simulation.faults import (
        FLEET_CHANCE,
        GANG_CHANCE,
        LEGACY_CHANCE,
        NOTICE_CHANCE,
        PRIORITY_CHANCE,
    )

    p = argparse.ArgumentParser(prog="provisionerd simulate", description="seeded whole-system simulation campaign")
    p.add_argument("--seeds", type=int, default=100, help="how many seeds to run (default 100)")
    p.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="any",
        help="force the workload of every run (default: drawn from each seed)",
    )
    p.add_argument("--trace", type=int, metavar="SEED", help="run one seed and print its whole trace")
    p.add_argument(
        "--wall-budget",
        type=float,
        default=None,
        help="wall seconds one run may take (default 120, and 120 per virtual hour of --churn)",
    )
    p.add_argument(
        "--churn",
        type=float,
        default=0.0,
        metavar="HOURS",
        help="long churn runs of HOURS virtual hours (demand changes every few minutes; link and daemon faults);"
        " each run prints its history figures",
    )
    p.add_argument(
        "--legacy-share",
        type=float,
        default=LEGACY_CHANCE,
        metavar="P",
        help="the chance that a one-daemon lifecycle run without a twin has a slow LSF one-shot plugin behind the"
        f" legacy adapter as its provider (default {LEGACY_CHANCE}: about one run in six; 0: none)",
    )
    p.add_argument(
        "--fleet-share",
        type=float,
        default=FLEET_CHANCE,
        metavar="P",
        help="the chance that a lifecycle run keeps warm headroom (and, in half of them, a CPU limit) on its"
        f" provider (default {FLEET_CHANCE}; 0: none)",
    )
    p.add_argument(
        "--notice-share",
        type=float,
        default=NOTICE_CHANCE,
        metavar="P",
        help="the chance that one joined machine of a lifecycle run gets a spot interruption notice and is taken"
        f" back at its end (default {NOTICE_CHANCE}; 0: none)",
    )
    p.add_argument(
        "--gang-share",
        type=float,
        default=GANG_CHANCE,
        metavar="P",
        help="the chance that a non-legacy lifecycle run's demand is all or nothing, with a cloud that answers some"
        f" of those requests in part (default {GANG_CHANCE}; 0: none)",
    )
    p.add_argument(
        "--priority-share",
        type=float,
        default=PRIORITY_CHANCE,
        metavar="P",
        help="the chance that a non-legacy lifecycle run without warm headroom offers two templates at two"
        f" priorities, the first with room for 2-5 machines (default {PRIORITY_CHANCE}; 0: none)",
    )
    return p


@attrs.frozen
class Draw:
    """What every world of a campaign is drawn from: the workload (``any``: each seed draws its own), the churn
    hours (0: ordinary runs) and the chance of each optional part of a world (the ``--*-share`` options)."""

    workload: str = "any"
    churn_hours: float = 0.0
    legacy_share: float = 0.0
    fleet_share: float = 0.0
    notice_share: float = 0.0
    gang_share: float = 0.0
    priority_share: float = 0.0

    @classmethod
    def of(cls, args: argparse.Namespace) -> Draw:
        return cls(
            args.workload,
            args.churn,
            legacy_share=args.legacy_share,
            fleet_share=args.fleet_share,
            notice_share=args.notice_share,
            gang_share=args.gang_share,
            priority_share=args.priority_share,
        )

    def shares_in_range(self) -> bool:
        shares = (self.legacy_share, self.fleet_share, self.notice_share, self.gang_share, self.priority_share)
        return all(0 <= share <= 1 for share in shares)

    def overrides(self) -> dict[str, Any]:
        """The ``World`` settings this draw fixes (a churn run has its own, ``churn.settings_for``)."""
        from provisionerd.testing.simulation import churn

        if self.churn_hours > 0:
            return churn.settings_for(self.churn_hours)
        drawn: dict[str, Any] = {} if self.workload == "any" else {"workload": self.workload}
        shares = {
            "legacy_share": self.legacy_share,
            "fleet_share": self.fleet_share,
            "notice_share": self.notice_share,
            "gang_share": self.gang_share,
            "priority_share": self.priority_share,
        }
        return {**drawn, **{name: share for name, share in shares.items() if share}}


@attrs.frozen
class Job:
    """One run of a campaign, as a worker process receives it."""

    seed: int
    draw: Draw
    budget: float  # wall seconds the run may take


def _run(job: Job) -> dict[str, Any]:
    from provisionerd.testing.simulation import World, run_world

    world = World(job.seed, keep_trace=False, **job.draw.overrides())
    result = run_world(world, wall_budget=job.budget)
    first = result.first
    line: dict[str, Any] = {"seed": job.seed, "virtual_s": result.virtual_seconds, "wall_s": result.wall_seconds}
    if world.churn is not None:
        line["churn"] = {**world.churn.summary(), "wall_s": round(result.wall_seconds, 3)}
    if first is not None:
        line.update(
            invariant=first.invariant,
            at=round(first.at, 6),
            detail=first.detail,
            workload=world.settings.workload,
            violations=len(result.violations),
            faults=list(result.faults),
        )
    return line


def _results(jobs: list[Job], processes: int) -> Iterator[dict[str, Any]]:
    if processes <= 1:
        yield from map(_run, jobs)
        return
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        yield from pool.imap(_run, jobs, chunksize=4)


def _trace(job: Job) -> int:
    from provisionerd.testing.simulation import World, run_world

    world = World(job.seed, keep_trace=True, **job.draw.overrides())
    print(
        json.dumps(
            {"seed": job.seed, "settings": repr(world.settings), "faults": [f.describe() for f in world.plan.faults]}
        )
    )
    result = run_world(world, wall_budget=job.budget)
    for line in world.recorder.trace:
        print(line)
    print(
        json.dumps(
            {
                "seed": job.seed,
                "violations": [[v.at, v.invariant, v.detail] for v in result.violations],
                "digest": result.digest,
            }
        )
    )
    return 1 if result.violations else 0


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse printed the problem (or the help)
        return int(exc.code or 0)
    budget = args.wall_budget if args.wall_budget is not None else 120.0 * max(1.0, args.churn)
    draw = Draw.of(args)
    if (
        args.seeds < 0
        or args.jobs < 1
        or args.start < 0
        or budget <= 0
        or not 0 <= args.churn <= 24 * 365
        or not draw.shares_in_range()
    ):
        print(
            "provisionerd simulate: --seeds, --start must be >= 0, --jobs >= 1, --wall-budget > 0,"
            " --churn between 0 and 8760 hours, the --*-share options between 0 and 1",
            file=sys.stderr,
        )
        return 2
    if args.trace is not None:
        return _trace(Job(args.trace, draw, budget))
    started = time.perf_counter()
    jobs = [Job(seed, draw, budget) for seed in range(args.start, args.start + args.seeds)]
    failing, virtual = 0, 0.0
    for line in _results(jobs, args.jobs):
        virtual += line["virtual_s"]
        if "churn" in line:
            print(json.dumps({"seed": line["seed"], "churn": line["churn"]}), flush=True)
        if "invariant" in line:
            failing += 1
            print(
                json.dumps(
                    {k: line[k] for k in ("seed", "invariant", "at", "detail", "workload", "violations", "faults")}
                ),
                flush=True,
            )
    summary = {
        "runs": len(jobs),
        "violations": failing,
        "virtual_hours": round(virtual / 3600, 3),
        "wall_s": round(time.perf_counter() - started, 3),
    }
    print(json.dumps(summary), flush=True)
    return 1 if failing else 0
