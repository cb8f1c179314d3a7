"""``provisionerd simulate``: one line per failing seed, then the summary line; the exit status says which."""

from __future__ import annotations

import json

from provisionerd.cli import main as cli


def lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]


def test_a_clean_campaign_prints_only_the_summary(capsys):
    assert cli.main(["simulate", "--seeds", "3", "--start", "200"]) == 0
    (summary,) = lines(capsys)
    assert summary["runs"] == 3 and summary["violations"] == 0
    assert summary["virtual_hours"] > 0.1 and summary["wall_s"] > 0


def test_a_failing_seed_gets_a_line_with_its_first_invariant(capsys, monkeypatch):
    from provisionerd.controller.ops import ControllerOps

    real_commit = ControllerOps.commit

    async def commit(self, fact):  # the seeded bug: intents are never really committed
        return 10**9 if type(fact).__name__ == "RequestIntent" else await real_commit(self, fact)

    monkeypatch.setattr(ControllerOps, "commit", commit)
    assert cli.main(["simulate", "--seeds", "2", "--start", "7", "--workload", "gate"]) == 1
    *failing, summary = lines(capsys)
    assert summary["runs"] == 2 and summary["violations"] == len(failing) >= 1
    assert {f["invariant"] for f in failing} == {"mutation_without_intent"}
    assert all(f["seed"] in (7, 8) and f["workload"] == "gate" and f["detail"] for f in failing)


def test_trace_prints_one_seeds_whole_story(capsys):
    assert cli.main(["simulate", "--trace", "5", "--workload", "gate"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    head, last = json.loads(out[0]), json.loads(out[-1])
    assert head["seed"] == 5 and last["violations"] == [] and len(last["digest"]) == 64
    assert any(" lease_acquired " in line for line in out[1:-1])


def test_bad_arguments_exit_2(capsys):
    assert cli.main(["simulate", "--seeds", "-1"]) == 2
    assert cli.main(["simulate", "--jobs", "zero"]) == 2
