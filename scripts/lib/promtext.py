"""Prometheus text exposition, just enough for the e2e check (standard library only)."""
import math
import re

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text):
    """Yield (name, labels dict, value) for every sample line."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(4))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        yield m.group(1), labels, v


def metric_sum(text, name, want=None):
    """Sum of every sample of `name` whose labels include `want`."""
    total = 0.0
    for n, labels, v in samples(text):
        if n == name and all(labels.get(k) == val for k, val in (want or {}).items()):
            total += v
    return total


def families(text):
    """Names of the families declared by `# TYPE` lines."""
    return [l.split()[2] for l in text.splitlines() if l.startswith("# TYPE ")]


def buckets(text, family, want=None):
    """Cumulative (le, count) of histogram `family`, summed over matching series, ascending."""
    acc = {}
    for n, labels, v in samples(text):
        if n != family + "_bucket" or "le" not in labels:
            continue
        if not all(labels.get(k) == val for k, val in (want or {}).items()):
            continue
        le = float(labels["le"])  # "+Inf" parses as inf
        acc[le] = acc.get(le, 0.0) + v
    return sorted(acc.items())


def bucket_delta(before, after):
    b = dict(before)
    return [(le, c - b.get(le, 0.0)) for le, c in after]


def histogram_quantile(q, cum):
    """PromQL histogram_quantile over cumulative (le, count) pairs; None if empty."""
    if not cum:
        return None
    total = cum[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in cum:
        if c >= rank:
            if math.isinf(le):
                return prev_le  # PromQL returns the highest finite bound
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le
