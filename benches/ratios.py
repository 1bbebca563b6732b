#!/usr/bin/env python3
"""Print the `core` benchmark results as Markdown tables with the ratios the project tracks.

Usage: python3 benches/ratios.py [TARGET_DIR]   (default: target, or $CARGO_TARGET_DIR)

Reads TARGET_DIR/criterion/<group>/<bench>/new/estimates.json (the mean point estimate, in ns
per criterion iteration) for the groups written by benches/core.rs:

* uncontended_pair: ns per acquire+release pair, and ours vs the bare floor, tokio and
  parking_lot (a ratio below 1 means ours is faster); `tokio_semaphore_owned` (an owned,
  'static permit) is listed for context, the ratios use the borrowed `tokio_semaphore`;
* two_threads: one iteration is one pair on each of two threads, so the aggregate throughput is
  2 / (ns per iteration) pairs per ns; shows wall ns per iteration, aggregate ns per pair, Mops/s
  and the throughput ratios ours/tokio and ours/parking_lot (above 1 means ours is faster);
* refused: ns per refusal, ours vs tokio;
* classes: the admission-class path beside the no-class pair and parking_lot in one group:
  ns per pair (one thread) or wall ns per iteration and Mops/s (two threads), with its targets:
  protected / no-class time <= 1.5x, borrowing / no-class time <= 2.5x, and two threads in
  different classes (protected) / parking_lot throughput >= 1x. `two_threads_borrowing` is
  context only.

Stdlib only. Missing benchmarks are shown as "n/a".
"""

import json
import os
import sys

BASELINES = ["bare_atomic_floor", "tokio_semaphore", "parking_lot_bulkhead"]
# Context only: tokio's owned ('static) permit, the counterpart of our Admission.
CONTEXT = ["tokio_semaphore_owned"]
OURS = ["ours_slots", "ours_slots_tokens", "ours_slots_tokens_id_read"]
PAIR_BENCHES = BASELINES[:2] + CONTEXT + BASELINES[2:] + OURS

# The committed targets (acquire+release pair).
TARGETS = [
    ("uncontended_pair", "ours_slots_tokens", "tokio_semaphore", "time", 1.0),
    ("uncontended_pair", "ours_slots_tokens", "bare_atomic_floor", "time", 2.0),
    ("two_threads", "ours_slots_tokens", "tokio_semaphore", "thrpt", 2.0),
    ("two_threads", "ours_slots_tokens", "parking_lot_bulkhead", "thrpt", 1.0),
]


def mean_ns(root, group, bench):
    path = os.path.join(root, "criterion", group, bench, "new", "estimates.json")
    try:
        with open(path) as f:
            return float(json.load(f)["mean"]["point_estimate"])
    except (OSError, KeyError, ValueError):
        return None


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def fmtx(x):
    return "n/a" if x is None else f"{x:.2f}x"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def uncontended(root):
    t = {b: mean_ns(root, "uncontended_pair", b) for b in PAIR_BENCHES}
    rows = []
    for b in PAIR_BENCHES:
        row = [f"`{b}`", fmt(t[b])]
        if b in OURS:
            row += [fmt(ratio(t[b], t[x])) + "x" for x in BASELINES]
        else:
            row += ["", "", ""]
        rows.append(row)
    header = ["bench", "ns/pair (mean)", "vs floor", "vs tokio", "vs parking_lot"]
    return t, "### uncontended_pair (one thread; time ratio, lower is better)\n\n" + table(
        header, rows
    )


def two_threads(root):
    t = {b: mean_ns(root, "two_threads", b) for b in PAIR_BENCHES}
    # Throughput in Mops/s: 2 pairs per iteration of `ns` nanoseconds.
    mops = {b: (None if t[b] is None else 2e3 / t[b]) for b in PAIR_BENCHES}
    rows = []
    # Benchmarks that exist only in the uncontended group have no row here.
    for b in (b for b in PAIR_BENCHES if t[b] is not None):
        row = [f"`{b}`", fmt(t[b]), fmt(t[b] / 2), fmt(mops[b])]
        if b in OURS:
            row += [
                fmt(ratio(mops[b], mops["bare_atomic_floor"])) + "x",
                fmt(ratio(mops[b], mops["tokio_semaphore"])) + "x",
                fmt(ratio(mops[b], mops["parking_lot_bulkhead"])) + "x",
            ]
        else:
            row += ["", "", ""]
        rows.append(row)
    header = [
        "bench",
        "wall ns/iter (1 pair per thread)",
        "ns/pair (aggregate)",
        "Mops/s (total)",
        "thrpt ours/floor",
        "thrpt ours/tokio",
        "thrpt ours/parking_lot",
    ]
    return mops, (
        "### two_threads (one shared instance; throughput ratio, higher is better)\n\n"
        + table(header, rows)
    )


def refused(root):
    names = ["tokio_no_permits", "ours_budget_limit", "ours_concurrency_limit"]
    t = {b: mean_ns(root, "refused", b) for b in names}
    rows = []
    for b in names:
        vs = "" if b.startswith("tokio") else fmt(ratio(t[b], t["tokio_no_permits"])) + "x"
        rows.append([f"`{b}`", fmt(t[b]), vs])
    return "### refused (one thread; time ratio, lower is better)\n\n" + table(
        ["bench", "ns/refusal (mean)", "vs tokio"], rows
    )


CLASS_ONE = ["ours_slots_tokens", "protected", "borrowing"]
CLASS_TWO = [
    "two_threads_parking_lot",
    "two_threads_ours_slots_tokens",
    "two_threads_protected",
    "two_threads_borrowing",
]
# (what, numerator, denominator, kind, bound): "time" ratios are one-thread ns per pair (lower
# is better, target <= bound); "thrpt" ratios are two-thread throughputs (target >= bound).
CLASS_TARGETS = [
    ("protected / no-class", "protected", "ours_slots_tokens", "time", 1.5),
    ("borrowing / no-class", "borrowing", "ours_slots_tokens", "time", 2.5),
    (
        "two threads, classes / parking_lot",
        "two_threads_protected",
        "two_threads_parking_lot",
        "thrpt",
        1.0,
    ),
]


def classes(root):
    t = {b: mean_ns(root, "classes", b) for b in CLASS_ONE + CLASS_TWO}
    rows = []
    for b in CLASS_ONE:
        vs = "" if b == "ours_slots_tokens" else fmtx(ratio(t[b], t["ours_slots_tokens"]))
        rows.append([f"`{b}`", "1", fmt(t[b]), "", vs, ""])
    mops = {b: (None if t[b] is None else 2e3 / t[b]) for b in CLASS_TWO}
    for b in CLASS_TWO:
        vs = ""
        if b != "two_threads_parking_lot":
            vs = fmtx(ratio(mops[b], mops["two_threads_parking_lot"]))
        rows.append([f"`{b}`", "2", fmt(t[b]), fmt(mops[b]), "", vs])
    header = [
        "bench",
        "threads",
        "ns/pair (1 thread) or wall ns/iter (2 threads)",
        "Mops/s (total)",
        "time vs no-class",
        "thrpt vs parking_lot",
    ]
    out = "### classes (three classes, floors 8/8/8 of 64 slots, token floors)\n\n" + table(
        header, rows
    )
    trows = []
    for what, num, den, kind, bound in CLASS_TARGETS:
        if kind == "time":
            r = ratio(t[num], t[den])
            ok = r is not None and r <= bound
            want = f"<= {bound}x"
        else:
            r = ratio(mops[num], mops[den])
            ok = r is not None and r >= bound
            want = f">= {bound}x"
        verdict = "n/a" if r is None else ("met" if ok else "MISSED")
        trows.append([what, f"`{num}` / `{den}`", fmtx(r), want, verdict])
    out += "\n\n### classes targets\n\n" + table(
        ["ratio", "benches", "measured", "target", "verdict"], trows
    )
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CARGO_TARGET_DIR", "target")
    if not os.path.isdir(os.path.join(root, "criterion")):
        sys.exit(f"no criterion results under {root}/criterion: run `cargo bench --bench core`")
    unc_t, unc = uncontended(root)
    two_mops, two = two_threads(root)
    print(unc + "\n\n" + two + "\n\n" + refused(root) + "\n")

    rows = []
    for group, ours, base, kind, bound in TARGETS:
        if kind == "time":
            r = ratio(unc_t[ours], unc_t[base])
            want, ok = f"<= {bound}x", r is not None and r <= bound
            what = f"{ours} time / {base} time"
        else:
            r = ratio(two_mops[ours], two_mops[base])
            want, ok = f">= {bound}x", r is not None and r >= bound
            what = f"{ours} thrpt / {base} thrpt"
        verdict = "n/a" if r is None else ("met" if ok else "MISSED")
        rows.append([group, what, fmt(r) + "x", want, verdict])
    print("### committed targets\n")
    print(table(["group", "ratio", "measured", "target", "verdict"], rows))
    print("\n" + classes(root))


if __name__ == "__main__":
    main()
