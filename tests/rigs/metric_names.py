"""Which metric names a dashboard or a rules file queries, and whether a daemon exports each one.

``queried(exprs)``: every metric name in PromQL expressions (an identifier followed by ``{``, ``[``, ``)`` or
the end, that is not a function, keyword or label name); ``exported(text)``: the names a Prometheus text exposition
serves (from its ``# TYPE`` families, so a labelled counter that has counted nothing yet is still named): a gauge
by its name, a counter by ``<name>_total`` (and ``_created``), a histogram by ``_bucket``, ``_sum`` and ``_count``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

#: PromQL words that look like names: functions, aggregations, keywords.
WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "on", "ignoring", "group_left", "group_right", "and",
    "or", "unless", "rate", "irate", "increase", "changes", "resets", "histogram_quantile", "time", "bool",
    "offset", "abs", "clamp_min", "clamp_max", "delta", "deriv", "topk", "bottomk", "label_values", "absent",
    "vector", "scalar", "sort", "sort_desc",
}  # fmt: skip
#: A name followed by a selector, a range, a closing parenthesis, a comparison, or the end.
_NAME = re.compile(
    r"(?<![\w:$.\"'])([a-zA-Z_:][a-zA-Z0-9_:]*)"  # not inside a word, a variable or a string
    r"(?=\s*(\{|\[|\)|$|\s*[=!<>]=?\s*\d|\s*(and|or|unless|\*)\b))"
)
_LABELS = re.compile(r"\{[^}]*\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def queried(exprs: Iterable[str]) -> set[str]:
    names: set[str] = set()
    for expr in exprs:
        bare = _GROUPING.sub(" ", _LABELS.sub("{}", expr))  # no label names or values left to mistake for metrics
        names |= {m.group(1) for m in _NAME.finditer(bare) if m.group(1) not in WORDS}
    return names


def exported(text: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
        else:
            names.add(family.name)
    return names
