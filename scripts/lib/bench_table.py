#!/usr/bin/env python3
"""Side-by-side table for scripts/bench-overhead.sh: direct vs through the proxy.

Reads OUT/<workload>-<side>-<round>/summary.json (goodput-loadtest's summary), pools the raw
per-request values of all rounds from requests.jsonl for exact percentiles, and prints each
workload's throughput and latency with the proxy/direct ratio and difference.
"""
import json
import math
import os
import sys


def nearest_rank(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    k = max(1, math.ceil(q * len(sorted_vals)))
    return sorted_vals[k - 1]


def load_side(out, workload, side, rounds):
    reqs, rps, tok = [], [], []
    for r in range(1, rounds + 1):
        d = os.path.join(out, f"{workload}-{side}-{r}")
        with open(os.path.join(d, "summary.json")) as f:
            s = json.load(f)["overall"]
        rps.append(s["requests_per_second"])
        tok.append(s["tokens"]["completion_per_second"])
        with open(os.path.join(d, "requests.jsonl")) as f:
            reqs.extend(json.loads(line) for line in f if line.strip())
    return reqs, rps, tok


def col(reqs, key):
    return sorted(r[key] for r in reqs if r.get(key) is not None and r.get("outcome") == "success")


def main():
    out, rounds = sys.argv[1], int(sys.argv[2])
    for workload in ("saturate", "paced"):
        d, d_rps, d_tok = load_side(out, workload, "direct", rounds)
        p, p_rps, p_tok = load_side(out, workload, "proxy", rounds)
        ok_d = sum(1 for r in d if r["outcome"] == "success")
        ok_p = sum(1 for r in p if r["outcome"] == "success")
        print(f"\n== {workload}: {len(d)} requests direct ({ok_d} success), "
              f"{len(p)} through the proxy ({ok_p} success), {rounds} alternating rounds per side")
        print(f"{'metric':<28}{'direct':>12}{'proxy':>12}{'proxy/direct':>14}{'diff':>12}")
        mean = lambda xs: sum(xs) / len(xs)
        for name, a, b in (("requests/s (mean of rounds)", mean(d_rps), mean(p_rps)),
                           ("tokens/s (mean of rounds)", mean(d_tok), mean(p_tok))):
            print(f"{name:<28}{a:>12.1f}{b:>12.1f}{b / a if a else float('nan'):>14.3f}{b - a:>12.1f}")
        for key, label in (("ttft_seconds", "TTFT"), ("tpot_seconds", "TPOT"), ("e2e_seconds", "E2E")):
            a, b = col(d, key), col(p, key)
            for q, qn in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                x, y = nearest_rank(a, q) * 1e3, nearest_rank(b, q) * 1e3
                ratio = y / x if x else float("nan")
                print(f"{label + ' ' + qn + ' (ms)':<28}{x:>12.3f}{y:>12.3f}{ratio:>14.3f}{y - x:>12.3f}")


if __name__ == "__main__":
    main()
