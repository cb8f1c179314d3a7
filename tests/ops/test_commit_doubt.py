"""``controller.commit_doubt``: a commit that ended without its ack makes every link whose last resync began before
the doubt's time resync once more when it comes, and only then (pure)."""

from __future__ import annotations

from provisionerd.controller.commit_doubt import CommitDoubt


def test_a_doubt_is_settled_by_a_resync_begun_at_or_after_its_time() -> None:
    doubt = CommitDoubt()
    assert not doubt.due(100.0, 0.0) and doubt.wake_at(0.0) == float("inf")
    doubt.doubt(now=50.0, grace=20.0)
    assert doubt.wake_at(60.0) == 70.0  # the new link resynced at 60: before the doubt's time
    assert not doubt.due(69.0, 60.0) and doubt.due(70.0, 60.0)
    assert not doubt.due(80.0, 70.0) and doubt.wake_at(70.0) == float("inf")  # the resync at 70 settled it
    doubt.doubt(now=40.0, grace=20.0)  # an older doubt never moves the time back
    assert doubt.at == 70.0
