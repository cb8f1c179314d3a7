"""The conformance kit: runs the provider contract against a plugin and reports one named row per check.

Every call goes through the real runtime (so every output is schema-checked on arrival) with the kit's per-call
timeout: a hung action becomes a failed row ("timed out"), never a hung kit, and the checks together stop at
``KitOptions.budget`` (the rows not reached then fail, saying so). Machines the kit created are returned at the end
even when a check failed.

**A row whose input failed still checks what it can.** The kit learns which machines its request made two ways:
from ``getRequestStatus``, and from ``listMachines`` (what the listing shows that it did not show before the
request). So when the status is unusable, the tag, idempotency, listing and return rows work from the listing:
a plugin that answers a new requestId for the same op_id and tags nothing is told exactly that. A row that cannot
run at all says which input it lacks (never a value it could not know, such as ``licensePools`` false when
``describeProvider`` was refused).

A legacy LSF plugin (one-shot, without ``describeProvider.sh``/``listMachines.sh``) is detected and reported as
such; ``legacy_checks`` runs the LSF subset of the contract through the legacy adapter
(:mod:`provisionerd.provider.legacy.kit`).
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from provisionerd.domain.errors import InvalidRequest, ProviderAnswerInvalid, ProviderError, ProviderRejected
from provisionerd.provider.legacy.adapter import detect_legacy
from provisionerd.provider.legacy.rules import machine_alive
from provisionerd.provider.paging import PageJoin, PagingViolation, next_cursor, page_input
from provisionerd.provider.runtime import PluginTransport

__all__ = ["CheckResult", "Kit", "KitOptions", "detect_legacy"]

CLUSTER = "conformance"
RETURN_ROW = "every machine the kit asked for is returned"
IDEMPOTENT_ROW = "same op_id twice gives the same requestId and no new machine"
LICENSE_ROW = "licence pools: listLicenses pages join up, returnLicenses refuses an unknown pool"
ALL_OR_NOTHING_ROW = "an all-or-nothing request the template cannot hold creates nothing"
RECLAIMS_ROW = "getReturnRequests is valid"
#: ``requestMachines.input.json``: ``template.machineCount`` at most this (and ``bootstrap`` as many entries).
MAX_MACHINE_COUNT = 10000
#: The answers that refuse an all-or-nothing request whole: no room, a limit, or a count above ``maxNumber``.
ALL_OR_NOTHING_REFUSALS = ("capacity_unavailable", "quota_exceeded", "invalid_request")
OWNER_KEYS = ("provisionerd:cluster", "provisionerd:provider", "provisionerd:op", "provisionerd:epoch")


@attrs.frozen
class CheckResult:
    """One row. ``warning``: passed, but worth a look (a check the daemon never relies on did not hold)."""

    name: str
    ok: bool
    detail: str = ""
    warning: bool = False


@attrs.frozen
class KitOptions:
    timeout: float = 30.0  # per call
    settle: float = 60.0  # how long a request may stay "running" (and returned machines stay listed)
    poll: float = 0.2  # seconds between status polls
    data_dir: str = ""  # the plugin's PRO_DATA_DIR, named when machines are left behind
    #: The checks together (the cleanup after them has its own bound: ``settle`` plus two call timeouts).
    budget: float = 180.0
    #: Cleanup rounds in a row that could read nothing of a request (no status entry, the listing refused) before
    #: the kit stops looking for its machines.
    blind_rounds: int = 3


#: The rows ``Kit.run`` makes before the cleanup, in order (those not reached when the budget runs out fail).
ROWS = (
    "describeProvider is valid and honest",
    "getAvailableTemplates is valid",
    "requestMachines gives a valid answer",
    "getRequestStatus reaches complete",
    "machines carry the owner tags and instanceRef",
    IDEMPOTENT_ROW,
    "listMachines shows the owner tags",
    "listMachines filters by tags",
    "listMachines pages join up",
    "requestReturnMachines works",
    "return twice is harmless",
    "returned machines leave listMachines",
    RECLAIMS_ROW,
    "an invalid request gives a typed error",
    LICENSE_ROW,
    ALL_OR_NOTHING_ROW,
)


class CheckFailed(Exception):
    """A check's expectation did not hold; the message is the row's detail."""


class CheckUnprovable(Exception):
    """A check could not be provoked, so it proves nothing either way: a passed row with a warning (WARN), the
    message its detail."""


class _Recorder:
    """Wraps the client: applies the kit timeout and keeps every output text for the join-token check."""

    def __init__(self, client: PluginTransport, timeout: float) -> None:
        self.client = client
        self.timeout = timeout
        self.texts: list[str] = []

    async def call(self, action: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        try:
            out = await self.client.call(action, doc, timeout=self.timeout)
        except ProviderError as exc:
            self.texts.append(str(exc))
            raise
        self.texts.append(json.dumps(out))
        return out


class Kit:
    def __init__(self, client: PluginTransport, options: KitOptions = KitOptions()) -> None:
        self.rpc = _Recorder(client, options.timeout)
        self.provider = client.name
        self.options = options
        self.rows: list[CheckResult] = []
        self.tokens: list[str] = []
        self.first_request: dict[str, Any] = {}
        self._nonce = secrets.token_hex(4)
        #: Every op the kit sent requestMachines for -> every requestId answered for it (a plugin that does not look
        #: the op_id up answers a new one each time; empty: the call's outcome is unknown).
        self.asked: dict[str, list[str]] = {}
        self.gone: set[str] = set()  # machines a return of the kit's was confirmed for
        self.can_list = True  # listMachines by op tag (a legacy plugin cannot list)
        #: The features of a describeProvider answer that passed its schema (None: none did).
        self.described: dict[str, bool] | None = None
        #: The cluster's listing before the kit's first request (None: it could not be read).
        self.listed_before: set[str] | None = None
        #: Whether requestReturnMachines answered the kit's return (its status may still be unusable).
        self.return_answered = False
        #: Machines the listing showed after the first request that it did not show before it.
        self.listed_new: dict[str, dict[str, Any]] = {}

    # --- plumbing --------------------------------------------------------------------------------------------------

    async def step(self, name: str, body: Callable[[], Awaitable[Any]], needs: Any = True, missing: str = "") -> Any:
        """Run one check; record its row; return its value (None when it failed or could not run). ``needs``
        ``None`` or ``False``: the row cannot run at all, and says why (``missing``: the input it lacks)."""
        if needs is None or needs is False:
            why = missing or "an earlier check it depends on failed"
            self.rows.append(CheckResult(name, False, f"not run: {why}"))
            return None
        try:
            value = await body()
        except (CheckFailed, ProviderError) as exc:
            self.rows.append(CheckResult(name, False, _describe(exc)))
            return None
        except CheckUnprovable as exc:
            self.rows.append(CheckResult(name, True, str(exc), warning=True))
            return None
        detail = value[1] if isinstance(value, tuple) else value if isinstance(value, str) else ""
        self.rows.append(CheckResult(name, True, detail))
        return value[0] if isinstance(value, tuple) else value

    def owner_tags(self, op_id: str) -> dict[str, str]:
        return {
            "provisionerd:cluster": CLUSTER,
            "provisionerd:provider": self.provider,
            "provisionerd:op": op_id,
            "provisionerd:epoch": "1.1",
        }

    def request_input(self, op_id: str, template_id: str, count: int) -> dict[str, Any]:
        boot = []
        for i in range(count):
            token = secrets.token_urlsafe(24)
            self.tokens.append(token)
            boot.append({"instanceRef": f"{op_id}-{i}", "controllers": ["127.0.0.1:7700"], "joinToken": token})
        return {
            "template": {"templateId": template_id, "machineCount": count},
            "rc_account": "default",
            "userData": {},
            "op_id": op_id,
            "tags": self.owner_tags(op_id),
            "bootstrap": boot,
        }

    async def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """``requestMachines``, remembered (before the call: a call that times out may still have made machines)
        so that ``return_everything`` gives back whatever it made."""
        op_id = request["op_id"]
        self.asked.setdefault(op_id, [])
        try:
            out = await self.rpc.call("requestMachines", request)
        except ProviderError as exc:
            if not exc.outcome_unknown and not self.asked[op_id]:
                del self.asked[op_id]  # refused: nothing was made
            raise
        self.asked[op_id].append(out["requestId"])
        return out

    async def settle(self, request_id: str) -> dict[str, Any]:
        """Poll ``getRequestStatus`` until the request leaves ``running``; its status entry."""
        with trio.move_on_after(self.options.settle):
            while True:
                out = await self.rpc.call("getRequestStatus", {"requests": [{"requestId": request_id}]})
                entry = next((r for r in out["requests"] if r["requestId"] == request_id), None)
                if entry is None:
                    others = [r["requestId"] for r in out["requests"]]
                    answered = f"answered for {others!r} instead" if others else "answered no request"
                    raise CheckFailed(f"getRequestStatus asked for request {request_id!r} {answered}")
                if entry["status"] != "running":
                    return entry
                await trio.sleep(self.options.poll)
        raise CheckFailed(f"request {request_id!r} still running after {self.options.settle:g} s")

    async def listed(self, tags: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        out = await self.rpc.call("listMachines", {"tags": dict(tags)})
        return {m["machineId"]: m for m in out["machines"]}

    # --- the checks ------------------------------------------------------------------------------------------------

    async def run(self) -> list[CheckResult]:
        try:
            with trio.move_on_after(self.options.budget) as budget:
                await self._checks()
            if budget.cancelled_caught:
                done = {row.name for row in self.rows}
                why = f"not run or not finished: the checks' budget of {self.options.budget:g} s ran out"
                self.rows += [CheckResult(name, False, why) for name in ROWS if name not in done]
        finally:
            with trio.CancelScope(shield=True):
                await self.return_everything()
        await self.step("join tokens never come back", self.check_tokens)
        return self.rows

    async def _checks(self) -> None:
        await self.step(ROWS[0], self.check_describe)
        template = await self.step(ROWS[1], self._templates_row)
        op_id = f"conformance-{self._nonce}"
        before = await self._cluster_listing()
        self.listed_before = None if before is None else set(before)
        request_id = await self.step(
            ROWS[2],
            lambda: self.check_request(op_id, template),
            template,
            "getAvailableTemplates gave no usable template (see its row)",
        )
        status = await self.step(
            ROWS[3],
            lambda: self.check_complete(request_id, template),
            request_id,
            "requestMachines gave no requestId (see its row)",
        )
        after = await self._cluster_listing() if op_id in self.asked else None
        if after is not None and self.listed_before is not None:
            self.listed_new = {mid: m for mid, m in after.items() if mid not in self.listed_before}
        machines: list[dict[str, Any]] = status or list(self.listed_new.values())
        listing = "shows none new since the request" if after is not None else "could not be read"
        unknown = (
            f"no machine of the kit's request is known: getRequestStatus reported none and listMachines {listing}"
            " (see their rows)"
        )
        known = machines or None  # an empty list: no machine to look at
        await self.step(ROWS[4], lambda: self.check_tags(op_id, machines, bool(status)), known, unknown)
        await self.step(
            ROWS[5],
            lambda: self.check_idempotent(op_id, status or []),
            self.asked.get(op_id) or None,
            "requestMachines gave no requestId (see its row)",
        )
        await self.step(ROWS[6], lambda: self.check_listed(op_id, machines, unknown))
        await self.step(ROWS[7], lambda: self.check_filter(machines, unknown))
        await self.step(ROWS[8], lambda: self.check_pages(machines))
        await self.step(ROWS[9], lambda: self.check_return(machines), known, unknown)
        # A return whose status could not be read still ran: its machines should leave the listing all the same.
        not_returned = "requestReturnMachines gave no requestId (see its row)"
        await self.step(ROWS[10], lambda: self.check_return_again(machines), self.return_answered, not_returned)
        await self.step(ROWS[11], lambda: self.check_gone(op_id, machines), self.return_answered, not_returned)
        await self.step(ROWS[12], lambda: self.check_return_requests(machines))
        await self.step(ROWS[13], self.check_invalid)
        await self.step(ROWS[14], lambda: self.check_licenses(self.described))
        await self.step(ROWS[15], lambda: self.check_all_or_nothing(self.described, template))

    async def _cluster_listing(self) -> dict[str, dict[str, Any]] | None:
        """The cluster's listing, or None when the plugin cannot list or its answer is refused (the listing rows
        say why)."""
        if not self.can_list:
            return None
        try:
            return await self.listed({"provisionerd:cluster": CLUSTER})
        except ProviderError:
            return None

    async def check_describe(self) -> tuple[dict[str, bool], str]:
        out = await self.rpc.call("describeProvider", {})
        features = out["features"]
        self.described = dict(features)
        missing = [f for f in ("idempotentRequest", "listMachines", "tags") if not features[f]]
        if missing:
            raise CheckFailed(f"provisionerd needs features {missing} (the plugin says it lacks them)")
        on = ", ".join(k for k, v in sorted(features.items()) if v)
        return features, f"{out['name']} {out['version']} (features: {on})"

    async def _templates_row(self) -> tuple[dict[str, Any], str]:
        chosen, detail = await self.check_templates(self.described)
        if self.described is None:
            detail += "; prices not checked: describeProvider gave no valid answer, so priceQuotes is unknown"
        return chosen, detail

    async def check_templates(self, features: dict[str, bool] | None) -> tuple[dict[str, Any], str]:
        out = await self.rpc.call("getAvailableTemplates", {})
        usable = [t for t in out["templates"] if t["maxNumber"] >= 1]
        if not usable:
            raise CheckFailed(f"no template with maxNumber >= 1 among {len(out['templates'])}")
        if features and features.get("priceQuotes") and not any("price" in t for t in out["templates"]):
            raise CheckFailed("features.priceQuotes is true but no template carries a price")
        chosen = usable[0]
        return chosen, f"{len(out['templates'])} templates; using {chosen['templateId']!r}"

    async def check_request(self, op_id: str, template: dict[str, Any]) -> tuple[str, str]:
        count = min(2, template["maxNumber"])
        self.first_request = self.request_input(op_id, template["templateId"], count)
        out = await self.ask(self.first_request)
        return out["requestId"], f"requestId {out['requestId']!r} for {count} machines"

    async def check_complete(self, request_id: str, template: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        entry = await self.settle(request_id)
        count = min(2, template["maxNumber"])
        if entry["status"] != "complete":
            raise CheckFailed(f"status {entry['status']!r}: {entry.get('message', '')!r}")
        machines = entry["machines"]
        bad = [m["machineId"] for m in machines if m["result"] != "succeed"]
        if len(machines) != count or bad:
            raise CheckFailed(f"{len(machines)} machines for {count} requested; not succeeded: {bad}")
        return machines, f"{count} machines: {', '.join(m['machineId'] for m in machines)}"

    async def check_tags(
        self, op_id: str, machines: list[dict[str, Any]], from_status: bool = True
    ) -> tuple[bool, str]:
        """The owner tags and the instanceRef of every machine: from getRequestStatus, or (``from_status`` false)
        from the machines the listing shows new since the request, whose ``provisionerd:instance`` tag must name
        an instanceRef the kit sent."""
        want = self.owner_tags(op_id)
        refs = {f"{op_id}-{i}" for i in range(int(self.first_request.get("template", {}).get("machineCount", 0)))}
        found: dict[str, list[str]] = {}  # each problem -> the machines that have it
        for m in machines:
            tags = m.get("tags") or {}
            wrong = [k for k, v in want.items() if tags.get(k) != v]
            if wrong:
                found.setdefault(f"owner tags missing or wrong: {wrong}", []).append(m["machineId"])
            ref = m.get("instanceRef") if from_status else tags.get("provisionerd:instance")
            if ref not in refs:
                what = "instanceRef" if from_status else "tag provisionerd:instance"
                found.setdefault(f"{what} {ref!r} is not one we sent", []).append(m["machineId"])
            elif from_status and tags.get("provisionerd:instance") != ref:
                found.setdefault("tag provisionerd:instance does not equal instanceRef", []).append(m["machineId"])
        problems = [f"{', '.join(mids)}: {problem}" for problem, mids in found.items()]
        if from_status and len({m.get("instanceRef") for m in machines}) != len(machines):
            problems.append("two machines share an instanceRef")
        source = "" if from_status else "getRequestStatus gave no machines; from listMachines: "
        if problems:
            raise CheckFailed(source + "; ".join(problems))
        return True, source + "all machines tagged"

    async def check_idempotent(self, op_id: str, machines: list[dict[str, Any]]) -> str:
        """The very same input again, op_id included: the same requestId, and no machine the listing did not show
        before the repeat; when the first request's status gave its machines, the repeat's must be the same. Each
        part is checked on its own, so a plugin is told every way it fails."""
        first_id = self.asked[op_id][0]
        before = await self._cluster_listing()
        out = await self.ask(self.first_request)
        problems, said = [], []
        if out["requestId"] != first_id:
            problems.append(f"new requestId for the same op_id: {first_id!r}, then {out['requestId']!r}")
        else:
            said.append(f"requestId {first_id!r} again")
        after = await self._cluster_listing()
        if before is None or after is None:
            said.append("listMachines could not be read, so new machines were not looked for there")
        elif not self.listed_new:
            said.append("listMachines does not show the kit's machines, so new ones could not be seen there")
        elif made := sorted(set(after) - set(before)):
            problems.append(f"the repeat made new machines: {', '.join(made)} (listMachines shows them now)")
        else:
            said.append("no new machine listed")
        if machines:
            try:
                entry = await self.settle(out["requestId"])
            except CheckFailed as exc:
                problems.append(f"the repeat's status: {exc}")
            else:
                first = sorted(m["machineId"] for m in machines)
                second = sorted(m["machineId"] for m in entry["machines"])
                if second != first:
                    problems.append(f"first request gave {first}, the repeat gave {second}")
                else:
                    said.append(f"the same {len(first)} machines")
        if problems:
            raise CheckFailed("; ".join(problems))
        return ", ".join(said)

    async def check_listed(self, op_id: str, machines: list[dict[str, Any]], unknown: str = "") -> str:
        """Each machine the kit knows it made is listed under the cluster's tag, with every owner tag (the listing
        is read even when no machine is known: a refused answer is the row's cause then)."""
        listed = await self.listed({"provisionerd:cluster": CLUSTER})
        if not machines:
            raise CheckFailed(f"the listing answered, but {unknown}")
        want = self.owner_tags(op_id)
        untagged, wrong, unlisted = [], [], []
        for m in machines:
            entry = listed.get(m["machineId"])
            if entry is None:
                unlisted.append(m["machineId"])
                continue
            tags = entry.get("tags") or {}
            bad = [k for k, v in want.items() if tags.get(k) != v]
            if len(bad) == len(want) and not any(k in tags for k in want):
                untagged.append(m["machineId"])
            elif bad:
                wrong.append(f"{m['machineId']} ({', '.join(bad)})")
        problems = []
        if untagged:
            problems.append(f"no owner tags on listed machines: {', '.join(untagged)} (none of {', '.join(want)})")
        if wrong:
            problems.append(f"owner tags missing or wrong on listed machines: {'; '.join(wrong)}")
        if unlisted:
            problems.append(
                f"not listed under the owner tags (cluster {CLUSTER!r}): {', '.join(unlisted)} (the listing filters"
                " by the tags a machine carries)"
            )
        if problems:
            raise CheckFailed("; ".join(problems))
        return f"{len(listed)} machines listed for cluster {CLUSTER!r}"

    async def check_filter(self, machines: list[dict[str, Any]], unknown: str = "") -> str:
        other = await self.listed({"provisionerd:cluster": f"{CLUSTER}-other-{self._nonce}"})
        if not machines:
            raise CheckFailed(f"the listing answered, but {unknown}")
        leaked = sorted(set(other) & {m["machineId"] for m in machines})
        if leaked:
            raise CheckFailed(f"a filter on another cluster lists our machines {leaked}")
        return "another cluster's filter lists none of ours"

    async def _one_a_page(
        self, action: str, field: str, key: str, max_pages: int
    ) -> tuple[PageJoin[dict[str, Any]], list[str]]:
        """Page through ``action`` (our cluster's tags) asking one item a page, each page's ``field`` list joined
        up by ``provider.paging`` (no cursor twice, at most ``max_pages``): the join and every ``key`` in page
        order. ``CheckFailed`` on a paging violation or an item on two pages."""
        join: PageJoin[dict[str, Any]] = PageJoin(self.provider, action, 1, max_pages, lambda d: d[key])
        seen: list[str] = []
        cursor: str | None = None
        while True:
            out = await self.rpc.call(action, page_input({"tags": {"provisionerd:cluster": CLUSTER}}, cursor, 1))
            seen.extend(d[key] for d in out[field])
            try:
                cursor = join.add(out[field], next_cursor(self.provider, action, out))
            except PagingViolation as exc:
                raise CheckFailed(exc.detail) from None
            if cursor is None:
                break
        twice = sorted(k for k, n in Counter(seen).items() if n > 1)
        if twice:
            raise CheckFailed(f"{field} on two pages: {twice[:5]}")
        return join, seen

    async def check_pages(self, machines: list[dict[str, Any]]) -> str:
        """Asked one machine a page, the pages must join up: each machine once, none missing, never more than
        asked on a page that has a next one, no cursor twice (``provider.paging``). A plugin that does not page
        answers everything at once: that works, up to the transport's line cap, and is said."""
        whole = set(await self.listed({"provisionerd:cluster": CLUSTER}))
        # A tighter cap than the daemon's: the kit knows the listing it expects to page through.
        join, seen = await self._one_a_page("listMachines", "machines", "machineId", 2 * len(whole) + 5)
        missing = sorted(whole - set(seen))
        ours = {m["machineId"] for m in machines} - set(seen)
        if missing or ours:
            raise CheckFailed(f"missing from the pages: {sorted(set(missing) | ours)[:5]}")
        if join.pages == 1 and len(seen) > 1:
            return f"does not page: {len(seen)} machines in one answer (fine up to the 8 MiB line cap)"
        return f"{len(seen)} machines in {join.pages} pages of 1, each once"

    def return_input(self, op_id: str, machines: list[dict[str, Any]]) -> dict[str, Any]:
        refs = [{"name": m["name"], "machineId": m["machineId"]} for m in machines]
        return {"machines": refs, "op_id": op_id, "tags": self.owner_tags(op_id)}

    async def check_return(self, machines: list[dict[str, Any]]) -> tuple[bool, str]:
        out = await self.rpc.call(
            "requestReturnMachines", self.return_input(f"conformance-ret-{self._nonce}", machines)
        )
        self.return_answered = True
        entry = await self.settle(out["requestId"])
        failed = [m["machineId"] for m in entry["machines"] if m["result"] != "succeed"]
        if entry["status"] != "complete" or failed:
            raise CheckFailed(f"return request {entry['status']!r}; not succeeded: {failed}")
        self.gone.update(m["machineId"] for m in machines)
        return True, f"return request {out['requestId']!r} complete"

    async def check_return_again(self, machines: list[dict[str, Any]]) -> str:
        same = await self.rpc.call(
            "requestReturnMachines", self.return_input(f"conformance-ret-{self._nonce}", machines)
        )
        fresh = await self.rpc.call(
            "requestReturnMachines", self.return_input(f"conformance-ret2-{self._nonce}", machines)
        )
        await self.settle(fresh["requestId"])
        return f"same op_id gave {same['requestId']!r}, a new op_id gave {fresh['requestId']!r}; no error"

    async def check_gone(self, op_id: str, machines: list[dict[str, Any]]) -> str:
        ours = {m["machineId"] for m in machines}
        with trio.move_on_after(self.options.settle):
            # A poll on purpose: the plugin's listing has no event to wait on.
            while ours & set(await self.listed({"provisionerd:cluster": CLUSTER})):  # noqa: ASYNC110
                await trio.sleep(self.options.poll)
            return "none of them is listed"
        raise CheckFailed(f"still listed after {self.options.settle:g} s")

    async def check_return_requests(self, machines: list[dict[str, Any]] | None) -> str:
        """The machines named; then, for a plugin whose features say ``reclaimsByTags``, the cluster's tag naming
        none: each machine that answer wants back with time left must be one ``listMachines`` shows under the same
        tag (a machine with time left is live, and the daemon drains only what it knows carries the tag)."""
        refs = [{"name": m["name"], "machineId": m["machineId"]} for m in machines or []]
        out = await self.rpc.call("getReturnRequests", {"machines": refs})
        detail = f"{len(out['requests'])} machines wanted back"
        if not (self.described or {}).get("reclaimsByTags"):
            return detail
        tags = {"provisionerd:cluster": CLUSTER}
        by_tags = await self.rpc.call("getReturnRequests", {"machines": [], "tags": tags})
        live = [r.get("machineId", "") for r in by_tags["requests"] if r.get("gracePeriod", 1) != 0]
        if live:
            listed = await self.listed(tags)
            unlisted = [machine_id for machine_id in live if machine_id not in listed]
            if unlisted:
                raise CheckFailed(
                    f"reclaimsByTags: wanted back by the cluster's tag but not listed under it: {unlisted[:5]}"
                )
        return f"{detail}; by the cluster's tag (reclaimsByTags): {len(by_tags['requests'])}"

    async def check_invalid(self) -> str:
        op_id = f"conformance-bad-{self._nonce}"
        try:
            out = await self.ask(self.request_input(op_id, f"no-such-template-{self._nonce}", 1))
        except ProviderRejected as exc:
            if not isinstance(exc, InvalidRequest):
                raise CheckFailed(f"expected code 'invalid_request', got {exc.code!r}: {exc.message[:200]!r}") from None
            return "unknown templateId -> invalid_request"
        raise CheckFailed(f"an unknown templateId was accepted: {out}")

    async def check_licenses(self, features: dict[str, bool] | None) -> str:
        """Only for a plugin whose features say ``licensePools`` (any other is never asked, and the row says so):
        ``listLicenses`` asked one pool a page joins up (each pool once, ``inUse <= granted``, no cursor twice),
        and ``returnLicenses`` for a pool that does not exist is a typed ``invalid_request``. Nothing real is
        checked in: a licence server's units may be in use by jobs the kit cannot see."""
        if features is None:
            raise CheckFailed(
                "not checked: describeProvider gave no valid answer (see its row), so whether the plugin declares"
                " licensePools is unknown"
            )
        if not features.get("licensePools"):
            return "not declared (features.licensePools is false): never asked"
        join, _ = await self._one_a_page("listLicenses", "licenses", "pool", 10_001)
        over = [g["pool"] for g in join.items if g["inUse"] > g["granted"]]
        if over:
            raise CheckFailed(f"pools with more units in use than granted: {over[:5]}")
        op_id = f"conformance-lic-{self._nonce}"
        bogus = {
            "op_id": op_id,
            "tags": self.owner_tags(op_id),
            "licenses": [{"pool": f"no-such-pool-{self._nonce}", "count": 1}],
        }
        try:
            answer = await self.rpc.call("returnLicenses", bogus)
        except ProviderRejected as exc:
            if not isinstance(exc, InvalidRequest):
                raise CheckFailed(f"unknown pool: expected 'invalid_request', got {exc.code!r}") from None
        else:
            raise CheckFailed(f"returnLicenses accepted a pool that does not exist: {answer}")
        idle = sum(g["granted"] - g["inUse"] for g in join.items)
        return f"{len(join.items)} pools in {join.pages} pages, {idle} units granted and idle; unknown pool refused"

    async def check_all_or_nothing(
        self, features: dict[str, bool] | None, template: dict[str, Any] | None
    ) -> tuple[bool, str]:
        """Only for a plugin whose features say ``allOrNothing`` (any other is never asked, and the row says so):
        ``maxNumber + 1`` machines of the kit's template, all or nothing, under a fresh op_id. The template cannot
        hold them, so the answer must be a typed refusal (``ALL_OR_NOTHING_REFUSALS``) and the op's listing must
        show no live machine. A plugin that accepts instead fails, naming how many machines it made; whatever it
        made is the kit's to return (``return_everything``: the op stays in ``asked``)."""
        if features is None:
            raise CheckFailed(
                "not checked: describeProvider gave no valid answer (see its row), so whether the plugin declares"
                " allOrNothing is unknown"
            )
        if not features.get("allOrNothing"):
            return True, "never asked (allOrNothing not declared)"
        if template is None:
            raise CheckFailed("not run: getAvailableTemplates gave no usable template (see its row)")
        tid, count = template["templateId"], template["maxNumber"] + 1
        if count > MAX_MACHINE_COUNT:
            raise CheckUnprovable(
                f"cannot be provoked: template {tid!r} holds maxNumber {template['maxNumber']}, and a request of"
                f" more than {MAX_MACHINE_COUNT} machines breaks the schema"
            )
        op_id = f"conformance-aon-{self._nonce}"
        asked = f"{count} machines of {tid!r} (maxNumber + 1), all or nothing"
        try:
            out = await self.ask({**self.request_input(op_id, tid, count), "allOrNothing": True})
        except ProviderRejected as exc:
            if exc.code not in ALL_OR_NOTHING_REFUSALS:
                expected = ", ".join(map(repr, ALL_OR_NOTHING_REFUSALS))
                raise CheckFailed(f"{asked}: expected {expected}, got {exc.code!r}: {exc.message[:200]!r}") from None
            refused = exc.code
        else:
            made = await self._made_by(op_id, out["requestId"])
            raise CheckFailed(
                f"{asked}: the plugin accepted it (requestId {out['requestId']!r}) and made {len(made)} machines"
                f"{': ' + ', '.join(sorted(made)[:5]) if made else ''}"
            )
        if not self.can_list:
            return True, f"{asked} -> {refused} (the plugin cannot list, so no machine was looked for)"
        listed = await self.listed({"provisionerd:cluster": CLUSTER, "provisionerd:op": op_id})
        alive = sorted(mid for mid, m in listed.items() if machine_alive(m))
        if alive:
            self.asked.setdefault(op_id, [])  # refused, yet it made machines: the cleanup returns them
            raise CheckFailed(
                f"{asked} -> {refused}, yet listMachines shows {len(alive)} machines of the op: {', '.join(alive[:5])}"
            )
        return True, f"{asked} -> {refused}; listMachines shows no machine of the op"

    async def _made_by(self, op_id: str, request_id: str) -> dict[str, dict[str, Any]]:
        """The live machines a request made: its settled status's, and (for a plugin that lists) the op's listing.
        A status that does not settle leaves the listing to say it."""
        made: dict[str, dict[str, Any]] = {}
        try:
            entry = await self.settle(request_id)
        except (CheckFailed, ProviderError):
            pass
        else:
            made.update((m["machineId"], m) for m in entry["machines"])
        if self.can_list:
            try:
                made.update(await self.listed({"provisionerd:cluster": CLUSTER, "provisionerd:op": op_id}))
            except ProviderError:
                pass
        return {mid: m for mid, m in made.items() if machine_alive(m)}

    async def check_tokens(self) -> str:
        echoed = sum(1 for token in self.tokens if any(token in text for text in self.rpc.texts))
        if echoed:
            raise CheckFailed(f"{echoed} join tokens appear in the plugin's outputs or errors")
        return f"{len(self.tokens)} tokens, {len(self.rpc.texts)} outputs checked"

    async def return_everything(self) -> None:
        """Give back every machine the kit asked for, whatever its request's status, verify they are gone, and
        add the row that says so: failed, naming the ids, for any it could not return or could not see.

        Until ``settle`` (plus two call timeouts) runs out: read what each request made (its status, any
        status, and its op's listing), return whatever is alive and not asked back yet (a request may report
        its machines only later), and stop once nothing is alive and every request has shown its machines. A
        plugin that shows nothing of a request for ``blind_rounds`` rounds in a row (no status entry for any of
        its requestIds, its listing refused) is not waited for: the row says what could not be read."""
        asked = {op: list(ids) for op, ids in self.asked.items()}
        if not asked:
            return
        sent: dict[str, dict[str, Any]] = {}
        problems: dict[str, None] = {}
        left: dict[str, dict[str, Any]] = {}
        unseen: list[str] = []
        blind: list[str] = []
        blind_rounds = 0
        # The settle time, plus room for the calls themselves (a round is 2-3 calls per request).
        with trio.move_on_after(self.options.settle + 2 * self.options.timeout):
            while True:
                unseen, blind = [], []
                left = await self._alive_machines(asked, unseen, blind)
                new = [m for mid, m in left.items() if mid not in sent]
                if new:
                    op_id = f"conformance-cleanup-{self._nonce}-{len(sent)}"
                    try:
                        await self.rpc.call("requestReturnMachines", self.return_input(op_id, new))
                    except ProviderError as exc:
                        problems[f"a return failed: {_describe(exc)}"] = None
                    sent.update((m["machineId"], m) for m in new)
                if not left and not unseen:
                    break
                blind_rounds = blind_rounds + 1 if unseen and len(blind) == len(unseen) and not left else 0
                if blind_rounds >= self.options.blind_rounds:
                    break
                await trio.sleep(self.options.poll)
        where = f"; the plugin's records are in {self.options.data_dir}" if self.options.data_dir else ""
        failures = list(problems)
        if left:
            failures.insert(0, f"could not return {len(left)}: {', '.join(sorted(left))}")
        if unseen:
            failures.append(f"requests whose machines were never reported, so cannot be returned: {', '.join(unseen)}")
        if blind and blind_rounds >= self.options.blind_rounds:
            failures.append(f"stopped looking after {blind_rounds} rounds in which {'; '.join(blind)}")
        if failures:
            self.rows.append(CheckResult(RETURN_ROW, False, "; ".join(failures) + where))
            return
        detail = f"returned {', '.join(sorted(sent))}; none left" if sent else "none left"
        self.rows.append(CheckResult(RETURN_ROW, True, f"{len(asked)} requests: {detail}"))

    async def _alive_machines(
        self, asked: Mapping[str, list[str]], unseen: list[str], blind: list[str]
    ) -> dict[str, dict[str, Any]]:
        """The machines of the kit's requests that still run: from each request's status (any status, every
        requestId the op was answered) and, when the plugin can list, from the listing of its op. A request neither
        shows is added to ``unseen``; one of which nothing could be read at all (no status entry, the listing
        refused), with what was read instead, to ``blind``."""
        found: dict[str, dict[str, Any]] = {}
        for op_id, request_ids in asked.items():
            seen = readable = False
            answered: list[str] = []
            for request_id in request_ids:
                try:
                    out = await self.rpc.call("getRequestStatus", {"requests": [{"requestId": request_id}]})
                except ProviderError as exc:
                    answered.append(f"getRequestStatus for {request_id!r}: {_describe(exc)[:200]}")
                    continue
                for entry in out["requests"]:
                    if entry["requestId"] == request_id:
                        readable = True
                        seen |= entry["status"] != "running" or bool(entry.get("machines"))
                        found.update((m["machineId"], m) for m in entry.get("machines", ()))
                if not readable:
                    others = [entry["requestId"] for entry in out["requests"]]
                    answered.append(f"getRequestStatus for {request_id!r} answered for {others!r}")
            if self.can_list:
                try:
                    listed = await self.listed({"provisionerd:cluster": CLUSTER, "provisionerd:op": op_id})
                except ProviderError as exc:
                    answered.append(f"listMachines of op {op_id!r}: {_describe(exc)[:200]}")
                else:
                    seen = readable = True
                    found.update(listed)
            if not seen:
                unseen.append(", ".join(map(repr, request_ids)) or repr(op_id))
            if not readable:
                blind.append(", ".join(answered) or f"nothing could be read of op {op_id!r}")
        return {mid: m for mid, m in found.items() if machine_alive(m)}


def _describe(exc: BaseException) -> str:
    """A row's text of a failure: every schema problem of a refused answer (each is a path and a rule, built from
    the schema, never from the answer), else the error's detail, cut at 600 characters."""
    if isinstance(exc, ProviderAnswerInvalid):
        return f"{type(exc).__name__}: answer refused at " + "; ".join(f"{path}: {rule}" for path, rule in exc.problems)
    if isinstance(exc, ProviderError):
        return f"{type(exc).__name__}: {exc.detail}"[:600]
    return str(exc)[:600]
