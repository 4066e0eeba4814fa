#!/usr/bin/env python3
"""Inclusive instructions per request of the functions in callgrind dumps, side by side.

scripts/bench-instructions.sh keeps each dump as OUT/KIND.BIN.PID.cg and prints the requests it
served (requests=N). This reads `callgrind_annotate --inclusive=yes` of one or more dumps and
prints, for every function whose name matches REGEX, its inclusive count divided by that dump's
requests: the cost of a function with everything it calls, per request, to compare two builds.

  python3 scripts/lib/cg_inclusive.py A.cg NA [B.cg NB ...] [--match REGEX] [--top N]

With no --match, the N (default 40) functions costliest in the first dump are listed. A name is
shortened to its last path segments (`crate::module::fn`) so two builds' hashes still line up.
"""

import argparse
import re
import signal
import subprocess
import sys

LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$")


def short(name: str) -> str:
    """Drops the file part and the symbol hash, keeps the last three path segments."""
    name = name.split(":", 1)[1] if re.match(r"^[^ ]*\.(rs|c|h|S):", name) else name
    name = re.sub(r"\s*\[[^\]]*\]$", "", name)  # callgrind's "[object]" suffix
    name = re.sub(r"::h[0-9a-f]{16}$", "", name)
    return name.strip()


def inclusive(path: str) -> dict:
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
        check=True, capture_output=True, text=True, errors="replace",
    ).stdout
    return parse(out)


def parse(out: str) -> dict:
    """Inclusive cost by shortened function name, from callgrind_annotate's text."""
    costs: dict = {}
    for line in out.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        fn = short(m.group(2))
        # Callers' lines (`=> file:fn (Nx)`) and the header are not functions of their own.
        if fn.startswith(("=>", "> ", "< ", "* ")) or fn == "events annotated":
            continue
        # callgrind_annotate lists a function once per source file its code came from (inlined
        # code keeps its own file): the same inclusive cost seen twice, not two costs.
        costs[fn] = max(costs.get(fn, 0), int(m.group(1).replace(",", "")))
    return costs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dumps", nargs="+", help="pairs: DUMP REQUESTS")
    p.add_argument("--match", help="regular expression over the shortened names")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    if len(a.dumps) % 2:
        p.error("give each dump with its request count: A.cg NA [B.cg NB ...]")
    pairs = [(a.dumps[i], int(a.dumps[i + 1])) for i in range(0, len(a.dumps), 2)]
    tables = [(path, n, inclusive(path)) for path, n in pairs]
    first = tables[0][2]
    if a.match:
        rx = re.compile(a.match)
        names = sorted({f for _, _, t in tables for f in t if rx.search(f)},
                       key=lambda f: -first.get(f, 0))
    else:
        names = sorted(first, key=lambda f: -first[f])[: a.top]
    head = " | ".join(f"{path.rsplit('/', 1)[-1][:24]:>24}" for path, _, _ in tables)
    print(f"{head}  (inclusive instructions per request)")
    for f in names:
        cells = " | ".join(f"{t.get(f, 0) / n:>24,.0f}" for _, n, t in tables)
        print(f"{cells}  {f[:140]}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly
    sys.exit(main())
