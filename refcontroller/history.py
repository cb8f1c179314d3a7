"""The history query (docs/protocol.md §6.6): a page of the fact log, ended lifecycles included.

A lifecycle that ended leaves the resync set (``store_lifecycle``), but its facts stay in the log for audit and for
spend over the whole history (``provisionerd cost``); ``HistoryQuery`` reads them a page at a time, the cursor a
fact index. Who may read what:

- an **admin** reads every provider (``providers`` empty) or the ones it names;
- a **provisioner** reads only providers its ``Join`` declared (empty: all of those); naming another is refused;
- a **worker** (or anything else) never: the per-role allowlist drops it before the body is read; this module
  refuses it again so the rule does not rest on one check.

Bounded work per query, whatever the sender asks: the cursor and the upper bound are clamped to the log's last
index (a hostile ``afterIndex`` of 2^64-1 is an empty, done page, never an SQLite overflow), a page holds at most
``PAGE_ITEMS`` facts (a larger ``maxFacts`` is clamped) and at most ``PAGE_BYTES`` of their estimated encoded size
(``paging.encoded_bound``, the resync pages' rule: a single larger fact gets a page of its own, and
``commits.MAX_FACT_BYTES`` bounds it), a query names at most ``MAX_QUERY_PROVIDERS`` providers, and the store reads
it with index scans stopped by their ``LIMIT`` (``FactStore.history_rows``). The etcd store answers from its
SQLite mirror, the same code.
"""

from __future__ import annotations

from collections.abc import Collection

from provisionerd.domain.model import CommittedFact, Role
from provisionerd.wire.messages import HistoryPage, HistoryQuery, Rejected
from refcontroller.commits import INVALID
from refcontroller.jsonconv import fact_from_json
from refcontroller.paging import PAGE_BYTES, PAGE_ITEMS, encoded_bound
from refcontroller.rules import RULES
from refcontroller.store import FactStore

#: Providers one query may name (each costs one bounded index scan).
MAX_QUERY_PROVIDERS = 64


class HistoryRefused(Exception):
    """The query is refused (``Rejected{invalid}`` with this reason): who sent it may not read what it names."""


def readable(role: Role, declared: Collection[str], query: HistoryQuery) -> frozenset[str] | None:
    """The providers ``query`` reads (``None``: every provider, an admin's empty list), or ``HistoryRefused``."""
    named = frozenset(query.providers)
    if len(named) > MAX_QUERY_PROVIDERS:
        raise HistoryRefused(f"a history query names at most {MAX_QUERY_PROVIDERS} providers, not {len(named)}")
    if role is Role.ADMIN:
        return named or None
    if role is not Role.PROVISIONER:
        raise HistoryRefused(f"role {role.value} may not read the history")
    wanted = named or frozenset(declared)
    if RULES.history_scope and not wanted <= frozenset(declared):
        others = ", ".join(sorted(wanted - frozenset(declared)))[:200]
        raise HistoryRefused(f"history of providers not declared in this connection's Join: {others}")
    if len(wanted) > MAX_QUERY_PROVIDERS:
        raise HistoryRefused(f"a history query reads at most {MAX_QUERY_PROVIDERS} providers: name some")
    return wanted


def history_page(
    store: FactStore,
    query: HistoryQuery,
    providers: frozenset[str] | None,
    *,
    max_items: int = PAGE_ITEMS,
    max_bytes: int = PAGE_BYTES,
) -> HistoryPage:
    """The page of ``providers``' facts (``None``: all) after ``query.after_index`` (``readable`` decided who)."""
    last = store.last_index()
    until = min(query.until_index, last) if query.until_index else last
    after = min(query.after_index, until)
    limit = min(query.max_facts, max_items) if query.max_facts else max_items
    rows = store.history_rows(providers, after, until, limit + 1)  # one more: whether the page is the last
    taken: list[CommittedFact] = []
    used = 0
    for index, body, at in rows[:limit]:
        size = encoded_bound(len(body.encode()))
        if taken and used + size > max_bytes:
            break
        taken.append(CommittedFact(index, fact_from_json(body), at))
        used += size
    done = len(taken) == len(rows)
    next_after = taken[-1].index if taken else until
    return HistoryPage(tuple(taken), next_after if not done else until, until, done)


def answer(store: FactStore, query: HistoryQuery, role: Role, declared: Collection[str]) -> HistoryPage | Rejected:
    """``history_page`` for what ``role`` may read, or the typed refusal (the caller logs and counts it)."""
    try:
        providers = readable(role, declared, query)
    except HistoryRefused as exc:
        return Rejected(INVALID, str(exc))
    return history_page(store, query, providers)
