"""The conformance kit: runs the provider contract against a plugin and reports one named row per check.

Every call goes through the real runtime (so every output is schema-checked on arrival) with the kit's per-call
timeout: a hung action becomes a failed row ("timed out"), never a hung kit. Checks that need an earlier result
(machines to return, say) are reported as skipped (not passed) when it is missing. Machines the kit created are
returned at the end even when a check failed.

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

from provisionerd.domain.errors import InvalidRequest, ProviderError, ProviderRejected
from provisionerd.provider.legacy.adapter import detect_legacy
from provisionerd.provider.legacy.rules import machine_alive
from provisionerd.provider.paging import PageJoin, PagingViolation, next_cursor, page_input
from provisionerd.provider.runtime import PluginTransport

__all__ = ["CheckResult", "Kit", "KitOptions", "detect_legacy"]

CLUSTER = "conformance"
RETURN_ROW = "every machine the kit asked for is returned"
LICENSE_ROW = "licence pools: listLicenses pages join up, returnLicenses refuses an unknown pool"
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


class CheckFailed(Exception):
    """A check's expectation did not hold; the message is the row's detail."""


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
        self.asked: dict[str, str | None] = {}  # every op the kit sent requestMachines for -> its requestId
        self.gone: set[str] = set()  # machines a return of the kit's was confirmed for
        self.can_list = True  # listMachines by op tag (a legacy plugin cannot list)

    # --- plumbing --------------------------------------------------------------------------------------------------

    async def step(self, name: str, body: Callable[[], Awaitable[Any]], needs: Any = True) -> Any:
        """Run one check; record its row; return its value (None when it failed or was skipped)."""
        if needs is None or needs is False:
            self.rows.append(CheckResult(name, False, "skipped: an earlier check it depends on failed"))
            return None
        try:
            value = await body()
        except (CheckFailed, ProviderError) as exc:
            self.rows.append(CheckResult(name, False, _describe(exc)))
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
        self.asked.setdefault(op_id, None)
        try:
            out = await self.rpc.call("requestMachines", request)
        except ProviderError as exc:
            if not exc.outcome_unknown and self.asked[op_id] is None:
                del self.asked[op_id]  # refused: nothing was made
            raise
        self.asked[op_id] = out["requestId"]
        return out

    async def settle(self, request_id: str) -> dict[str, Any]:
        """Poll ``getRequestStatus`` until the request leaves ``running``; its status entry."""
        with trio.move_on_after(self.options.settle):
            while True:
                out = await self.rpc.call("getRequestStatus", {"requests": [{"requestId": request_id}]})
                entry = next((r for r in out["requests"] if r["requestId"] == request_id), None)
                if entry is None:
                    raise CheckFailed(f"getRequestStatus did not report request {request_id!r}")
                if entry["status"] != "running":
                    return entry
                await trio.sleep(self.options.poll)
        raise CheckFailed(f"request {request_id!r} still running after {self.options.settle:g} s")

    async def listed(self, tags: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        out = await self.rpc.call("listMachines", {"tags": dict(tags)})
        return {m["machineId"]: m for m in out["machines"]}

    # --- the checks ------------------------------------------------------------------------------------------------

    async def run(self) -> list[CheckResult]:
        features = await self.step("describeProvider is valid and honest", self.check_describe)
        template = await self.step("getAvailableTemplates is valid", lambda: self.check_templates(features))
        op_id = f"conformance-{self._nonce}"
        try:
            request_id = await self.step(
                "requestMachines gives a valid answer", lambda: self.check_request(op_id, template), template
            )
            machines = await self.step(
                "getRequestStatus reaches complete", lambda: self.check_complete(request_id, template), request_id
            )
            await self.step(
                "machines carry the owner tags and instanceRef", lambda: self.check_tags(op_id, machines), machines
            )
            await self.step(
                "same op_id twice gives the same machines",
                lambda: self.check_idempotent(op_id, machines),
                machines,
            )
            await self.step("listMachines shows the owner tags", lambda: self.check_listed(op_id, machines), machines)
            await self.step("listMachines filters by tags", lambda: self.check_filter(machines), machines)
            await self.step("listMachines pages join up", lambda: self.check_pages(machines), machines)
            returned = await self.step("requestReturnMachines works", lambda: self.check_return(machines), machines)
            await self.step("return twice is harmless", lambda: self.check_return_again(machines), returned)
            await self.step("returned machines leave listMachines", lambda: self.check_gone(op_id, machines), returned)
            await self.step("getReturnRequests is valid", lambda: self.check_return_requests(machines))
            await self.step("an invalid request gives a typed error", self.check_invalid)
            await self.step(LICENSE_ROW, lambda: self.check_licenses(features))
        finally:
            with trio.CancelScope(shield=True):
                await self.return_everything()
        await self.step("join tokens never come back", self.check_tokens)
        return self.rows

    async def check_describe(self) -> tuple[dict[str, bool], str]:
        out = await self.rpc.call("describeProvider", {})
        features = out["features"]
        missing = [f for f in ("idempotentRequest", "listMachines", "tags") if not features[f]]
        if missing:
            raise CheckFailed(f"provisionerd needs features {missing} (the plugin says it lacks them)")
        on = ", ".join(k for k, v in sorted(features.items()) if v)
        return features, f"{out['name']} {out['version']} (features: {on})"

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

    async def check_tags(self, op_id: str, machines: list[dict[str, Any]]) -> tuple[bool, str]:
        want = self.owner_tags(op_id)
        refs = {f"{op_id}-{i}" for i in range(len(machines))}
        problems = []
        for m in machines:
            tags = m.get("tags") or {}
            wrong = [k for k, v in want.items() if tags.get(k) != v]
            if wrong:
                problems.append(f"{m['machineId']}: owner tags missing or wrong: {wrong}")
            if m.get("instanceRef") not in refs:
                problems.append(f"{m['machineId']}: instanceRef {m.get('instanceRef')!r} is not one we sent")
            elif tags.get("provisionerd:instance") != m["instanceRef"]:
                problems.append(f"{m['machineId']}: tag provisionerd:instance does not equal instanceRef")
        if len({m.get("instanceRef") for m in machines}) != len(machines):
            problems.append("two machines share an instanceRef")
        if problems:
            raise CheckFailed("; ".join(problems))
        return True, "all machines tagged"

    async def check_idempotent(self, op_id: str, machines: list[dict[str, Any]]) -> str:
        out = await self.ask(self.first_request)  # the very same input, op_id included
        entry = await self.settle(out["requestId"])
        first = sorted(m["machineId"] for m in machines)
        second = sorted(m["machineId"] for m in entry["machines"])
        listed = sorted(await self.listed({"provisionerd:cluster": CLUSTER, "provisionerd:op": op_id}))
        if second != first or listed != first:
            raise CheckFailed(f"first request gave {first}, the repeat gave {second}; listMachines shows {listed}")
        return f"requestId {out['requestId']!r}, the same {len(first)} machines"

    async def check_listed(self, op_id: str, machines: list[dict[str, Any]]) -> str:
        listed = await self.listed({"provisionerd:cluster": CLUSTER})
        want = self.owner_tags(op_id)
        problems = []
        for m in machines:
            entry = listed.get(m["machineId"])
            if entry is None:
                problems.append(f"{m['machineId']} is not listed")
            elif any(entry["tags"].get(k) != v for k, v in want.items()):
                problems.append(f"{m['machineId']} is listed without the owner tags")
        if problems:
            raise CheckFailed("; ".join(problems))
        return f"{len(listed)} machines listed for cluster {CLUSTER!r}"

    async def check_filter(self, machines: list[dict[str, Any]]) -> str:
        other = await self.listed({"provisionerd:cluster": f"{CLUSTER}-other-{self._nonce}"})
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
        refs = [{"name": m["name"], "machineId": m["machineId"]} for m in machines or []]
        out = await self.rpc.call("getReturnRequests", {"machines": refs})
        return f"{len(out['requests'])} machines wanted back"

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
        if not features or not features.get("licensePools"):
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
        its machines only later), and stop once nothing is alive and every request has shown its machines."""
        asked = dict(self.asked)
        if not asked:
            return
        sent: dict[str, dict[str, Any]] = {}
        problems: dict[str, None] = {}
        left: dict[str, dict[str, Any]] = {}
        unseen: list[str] = []
        # The settle time, plus room for the calls themselves (a round is 2-3 calls per request).
        with trio.move_on_after(self.options.settle + 2 * self.options.timeout):
            while True:
                unseen = []
                left = await self._alive_machines(asked, unseen)
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
                await trio.sleep(self.options.poll)
        where = f"; the plugin's records are in {self.options.data_dir}" if self.options.data_dir else ""
        failures = list(problems)
        if left:
            failures.insert(0, f"could not return {len(left)}: {', '.join(sorted(left))}")
        if unseen:
            failures.append(f"requests whose machines were never reported, so cannot be returned: {', '.join(unseen)}")
        if failures:
            self.rows.append(CheckResult(RETURN_ROW, False, "; ".join(failures) + where))
            return
        detail = f"returned {', '.join(sorted(sent))}; none left" if sent else "none left"
        self.rows.append(CheckResult(RETURN_ROW, True, f"{len(asked)} requests: {detail}"))

    async def _alive_machines(self, asked: Mapping[str, str | None], unseen: list[str]) -> dict[str, dict[str, Any]]:
        """The machines of the kit's requests that still run: from each request's status (any status) and, when
        the plugin can list, from the listing of its op. A request neither shows is added to ``unseen``."""
        found: dict[str, dict[str, Any]] = {}
        for op_id, request_id in asked.items():
            seen = False
            if request_id is not None:
                try:
                    out = await self.rpc.call("getRequestStatus", {"requests": [{"requestId": request_id}]})
                except ProviderError:
                    out = {"requests": []}
                for entry in out["requests"]:
                    if entry["requestId"] == request_id:
                        seen |= entry["status"] != "running" or bool(entry.get("machines"))
                        found.update((m["machineId"], m) for m in entry.get("machines", ()))
            if self.can_list:
                try:
                    listed = await self.listed({"provisionerd:cluster": CLUSTER, "provisionerd:op": op_id})
                except ProviderError:
                    pass
                else:
                    seen = True
                    found.update(listed)
            if not seen:
                unseen.append(repr(request_id or op_id))
        return {mid: m for mid, m in found.items() if machine_alive(m)}


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ProviderError):
        return f"{type(exc).__name__}: {exc.detail}"[:600]
    return str(exc)[:600]
