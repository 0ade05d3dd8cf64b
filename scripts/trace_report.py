#!/usr/bin/env python3
"""Summarises a MOESTREAM_TRACE timeline (config/event_trace.h) of a streamed decode.

Usage: MOESTREAM_TRACE=/tmp/t.csv moestream bench decode ...; scripts/trace_report.py /tmp/t.csv [--step N]

Decode steps are the layer-0 picks of one row; steps more than 300 ms apart start a new phase
(bench decode runs several). Per phase: the median step, the disk's idle time in a step (no
expert read outstanding) and how much of it fell while the forward waited for experts. With
--step N, the N-th step of the first phase event by event (reads folded per layer).
"""
import csv
import statistics
import sys

READS = ("read_hint", "read_demand")


def load(path):
    with open(path) as f:
        return [(float(r["us"]), int(r["thread"]), r["event"], int(r["layer"]), int(r["value"]))
                for r in csv.DictReader(f)]


def phases_of(rows):
    starts = [i for i, r in enumerate(rows) if r[2] == "picks_wait" and r[3] == 0 and r[4] == 1]
    phases = []
    for i in starts:
        if phases and rows[i][0] - rows[phases[-1][-1]][0] <= 300e3:
            phases[-1].append(i)
        else:
            phases.append([i])
    return phases


def step_profile(rows, a, b):
    out, idle, idle_waiting, reads, last, waiting = set(), 0.0, 0.0, 0, rows[a][0], False
    for t, _, ev, layer, value in rows[a:b]:
        if not out:
            idle += t - last
            if waiting:
                idle_waiting += t - last
        last = t
        if ev in READS:
            out.add((layer, value))
            reads += 1
        elif ev == "read_done":
            out.discard((layer, value))
        elif ev == "wait_begin":
            waiting = True
        elif ev == "wait_end":
            waiting = False
    return (rows[b][0] - rows[a][0]) / 1e3, idle / 1e3, idle_waiting / 1e3, reads


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    phases = phases_of(rows)
    for n, ph in enumerate(phases):
        prof = [step_profile(rows, a, b) for a, b in zip(ph, ph[1:])]
        if not prof:
            continue
        med = [statistics.median(p[k] for p in prof) for k in range(4)]
        print(f"phase {n}: {len(ph)} steps, step {med[0]:.1f} ms (median), disk idle {med[1]:.1f} ms a step "
              f"({med[2]:.1f} of it while the forward waited), {med[3]:.0f} reads a step")
    if "--step" in sys.argv and phases:
        k = int(sys.argv[sys.argv.index("--step") + 1])
        a, b = phases[0][k], phases[0][k + 1]
        t0 = rows[a][0]
        for t, th, ev, layer, value in rows[a:b]:
            print(f"{t - t0:9.1f} t{th} {ev:12s} L{layer:<3d} {value}")


if __name__ == "__main__":
    main()
