"""Load and check the simulated provider's configuration (``simulated.json``).

The file is looked up as ``$PRO_CONF_DIR/simulated.json`` and, when that does not exist, the default shipped next to
the plugin (``providers/simulated/conf/simulated.json``). A bad file is a ``provider_error`` with the path of the
offending field, never a traceback: the daemon shows that message to an operator.

Standard library only: the plugin runs under whatever ``python3`` the host has.
"""

from __future__ import annotations

import os

from provisionerd.plugin_sdk.config import ConfigInvalid, read_json

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(PLUGIN_DIR, "conf", "simulated.json")

#: Every fault kind and the actions it applies to when the rule names none.
FAULT_KINDS = {
    "capacity": ("requestMachines",),
    "quota": ("requestMachines",),
    "partial": ("requestMachines",),
    "foreign_id": ("requestMachines",),
    "vanish": ("listMachines",),
    "reclaim": ("getReturnRequests",),
    "throttle": None,  # None: the rule must name its actions
    "auth": None,
    "provider_error": None,
    "slow": None,
    "hang": None,
    "crash": None,
    "garbage": None,
}
ACTIONS = (
    "describeProvider",
    "getAvailableTemplates",
    "requestMachines",
    "getRequestStatus",
    "requestReturnMachines",
    "getReturnRequests",
    "listMachines",
    "listLicenses",
    "returnLicenses",
)
ATTRIBUTE_TYPES = ("String", "Numeric", "Boolean")


def _fail(where: str, what: str) -> ConfigInvalid:
    return ConfigInvalid(f"simulated.json: {where}: {what}", "simulated.json")


def _int(doc: dict, key: str, where: str, default: int | None = None, minimum: int = 0) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(f"{where}.{key}", f"expected an integer >= {minimum}, got {value!r}")
    return value


def _number(doc: dict, key: str, where: str, default: float | None = None) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise _fail(f"{where}.{key}", f"expected a number >= 0, got {value!r}")
    return float(value)


def _named(doc: object, key: str, where: str) -> str:
    """``doc[key]`` of an object that must name itself with a non-empty string."""
    if not isinstance(doc, dict):
        raise _fail(where, "expected an object")
    name = doc.get(key)
    if not isinstance(name, str) or not name:
        raise _fail(f"{where}.{key}", f"expected a non-empty string, got {name!r}")
    return name


def _check_template(t: object, where: str) -> dict:
    tid = _named(t, "templateId", where)
    max_number = _int(t, "maxNumber", where, minimum=0)
    capacity = _int(t, "capacity", where, default=max_number, minimum=0)
    attrs = t.get("attributes")
    if not isinstance(attrs, dict) or not attrs:
        raise _fail(f"{where}.attributes", "expected a non-empty object of [type, value] pairs")
    for name, pair in attrs.items():
        ok = isinstance(pair, list) and len(pair) == 2 and pair[0] in ATTRIBUTE_TYPES and isinstance(pair[1], str)
        if not ok:
            raise _fail(
                f"{where}.attributes.{name}", f'expected ["String"|"Numeric"|"Boolean", "<text>"], got {pair!r}'
            )
    price = t.get("price")
    if price is not None:
        pw = f"{where}.price"
        if not isinstance(price, dict):
            raise _fail(pw, "expected an object")
        _number(price, "amount", pw)
        for key in ("currency", "unit"):
            if not isinstance(price.get(key), str) or not price[key]:
                raise _fail(f"{pw}.{key}", f"expected a non-empty string, got {price.get(key)!r}")
        if "timestamp" in price and not isinstance(price["timestamp"], str):
            raise _fail(f"{pw}.timestamp", "expected an RFC 3339 string")
    return {"templateId": tid, "maxNumber": max_number, "capacity": capacity, "attributes": attrs, "price": price}


def _check_pool(pool: object, where: str) -> dict:
    """A licence pool the simulated licence source holds for the cluster: ``granted`` units checked out to it, of
    which ``inUse`` are in use by the source's own count. ``granted > inUse`` is a leak (units held, unused);
    ``checkedOut`` (epoch seconds) defaults to when the pool was first listed."""
    name = _named(pool, "pool", where)
    granted = _int(pool, "granted", where, minimum=0)
    in_use = _int(pool, "inUse", where, default=0, minimum=0)
    if in_use > granted:
        raise _fail(f"{where}.inUse", f"expected at most granted ({granted}), got {in_use}")
    checked_out = None if pool.get("checkedOut") is None else _number(pool, "checkedOut", where)
    return {"pool": name, "granted": granted, "inUse": in_use, "checkedOut": checked_out}


def _check_fault(rule: object, where: str) -> dict:
    if not isinstance(rule, dict):
        raise _fail(where, "expected an object")
    kind = rule.get("kind")
    if kind not in FAULT_KINDS:
        raise _fail(f"{where}.kind", f"expected one of {sorted(FAULT_KINDS)}, got {kind!r}")
    default = FAULT_KINDS[kind]
    actions = rule.get("actions", None if default is None else list(default))
    if actions is None:
        raise _fail(f"{where}.actions", f'a {kind!r} fault must name its actions (a list, or ["*"])')
    if not isinstance(actions, list) or not all(a == "*" or a in ACTIONS for a in actions):
        raise _fail(f"{where}.actions", f'expected a list of {list(ACTIONS)} or ["*"], got {actions!r}')
    templates = rule.get("templates")
    if templates is not None and not (isinstance(templates, list) and all(isinstance(x, str) for x in templates)):
        raise _fail(f"{where}.templates", f"expected a list of template ids, got {templates!r}")
    probability = rule.get("probability")
    if probability is not None:
        probability = _number(rule, "probability", where)
        if probability > 1:
            raise _fail(f"{where}.probability", "expected a number in [0, 1]")
    out = {
        "kind": kind,
        "actions": ("*",) if "*" in actions else tuple(actions),
        "templates": None if templates is None else tuple(templates),
        "every": _int(rule, "every", where, default=1, minimum=1),
        "after": _int(rule, "after", where, default=0),
        "times": None if rule.get("times") is None else _int(rule, "times", where, minimum=1),
        "probability": probability,
        "delaySeconds": _number(rule, "delaySeconds", where, default=1.0),
        "count": _int(rule, "count", where, default=1, minimum=0),
        "gracePeriod": _int(rule, "gracePeriod", where, default=120),
        "message": rule.get("message"),
    }
    if "fraction" in rule:
        out["fraction"] = _number(rule, "fraction", where)
    return out


def parse(doc: object) -> dict:
    """Check a decoded configuration document and return it normalised (every default filled in)."""
    if not isinstance(doc, dict):
        raise _fail("$", "expected an object")
    seed = doc.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, (int, str)):
        raise _fail("seed", f"expected an integer or a string, got {seed!r}")
    delays = doc.get("delays", {})
    if not isinstance(delays, dict):
        raise _fail("delays", "expected an object")
    quota = doc.get("quota", {})
    if not isinstance(quota, dict):
        raise _fail("quota", "expected an object")
    templates = doc.get("templates")
    if not isinstance(templates, list) or not templates:
        raise _fail("templates", "expected a non-empty list")
    checked = [_check_template(t, f"templates[{i}]") for i, t in enumerate(templates)]
    by_id = {t["templateId"]: t for t in checked}
    if len(by_id) != len(checked):
        raise _fail("templates", "templateId values must be unique")
    faults = doc.get("faults", [])
    if not isinstance(faults, list):
        raise _fail("faults", "expected a list")
    pools = doc.get("licensePools", [])
    if not isinstance(pools, list):
        raise _fail("licensePools", "expected a list")
    checked_pools = [_check_pool(p, f"licensePools[{i}]") for i, p in enumerate(pools)]
    if len({p["pool"] for p in checked_pools}) != len(checked_pools):
        raise _fail("licensePools", "pool names must be unique")
    return {
        "name": str(doc.get("name", "simulated")),
        "seed": str(seed),
        "bootPolls": _int(delays, "bootPolls", "delays", default=1),
        "bootSeconds": _number(delays, "bootSeconds", "delays", default=0.0),
        "returnPolls": _int(delays, "returnPolls", "delays", default=0),
        "maxMachines": _int(quota, "maxMachines", "quota", default=1_000_000),
        "templates": checked,
        "templatesById": by_id,
        "faults": [_check_fault(f, f"faults[{i}]") for i, f in enumerate(faults)],
        "licensePools": checked_pools,
    }


def config_path(env: dict) -> str:
    conf_dir = env.get("PRO_CONF_DIR")
    if conf_dir:
        candidate = os.path.join(conf_dir, "simulated.json")
        if os.path.exists(candidate):
            return candidate
    return DEFAULT_CONFIG


def load(env: dict) -> dict:
    """Read and check the configuration the environment points at (see the module docstring)."""
    return parse(read_json(config_path(env)))
