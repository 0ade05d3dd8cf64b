#!/usr/bin/env python3
"""Summarises a MOESTREAM_TRACE timeline (config/event_trace.h) of a streamed decode.

Usage: MOESTREAM_TRACE=/tmp/t.csv moestream bench decode ...; scripts/trace_report.py /tmp/t.csv [--step N] [--layers] [--host]

Decode steps are the layer-0 picks of one row; steps more than 300 ms apart start a new phase
(bench decode runs several). Per phase: the median step, the disk's idle time in a step (no
expert read outstanding) and how much of it fell while the forward waited for experts. With
--step N, the N-th step of the first phase event by event (reads folded per layer). With --layers,
per layer of the first phase's steps (the first two and the last left out): demand and predicted
reads, the forward's wait for experts, and the disk's idle time while the forward was at that
layer (from its picks to the next layer's; the last layer's share holds the head and sampling).
With --host, per layer, where the forward thread's time goes between its events (host_profile).
"""
import collections
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


def layer_profile(rows, phase):
    demand, hinted, wait, idle = (collections.Counter() for _ in range(4))
    steps = 0
    for s in range(2, len(phase) - 1):
        a, b = phase[s], phase[s + 1]
        out, last, layer, began = set(), rows[a][0], 0, None
        for t, _, ev, L, v in rows[a:b]:
            if not out:
                idle[layer] += t - last
            last = t
            if ev == "picks_wait":
                layer = L
            if ev in READS:
                out.add((L, v))
                (demand if ev == "read_demand" else hinted)[L] += 1
            elif ev == "read_done":
                out.discard((L, v))
            elif ev == "wait_begin":
                began = t
            elif ev == "wait_end" and began is not None:
                wait[L] += t - began
                began = None
        steps += 1
    if steps == 0:
        return
    print(f"per layer over {steps} steps (a step's mean): demand reads, predicted reads, wait us, disk idle us")
    for L in sorted(set(demand) | set(hinted) | set(wait) | set(idle)):
        print(f"  L{L:<3d} {demand[L] / steps:5.2f} {hinted[L] / steps:5.2f} {wait[L] / steps:8.0f} {idle[L] / steps:8.0f}")


def host_profile(rows, phase):
    """Per layer, the forward thread's time between its events, means over the phase's steps (the
    first two and the last left out): picks (from asking for the router's picks to announcing the
    layer's union: the download waits for the device to run everything enqueued before it), plan
    (the announcement, the hints and the jobs, up to the first wait for experts), wait (for
    experts), issue (from the last wait to the layer's MoE kernels all issued), then up to the next
    layer's picks: sum (to the next layer's start), attn (its engram rows, attention and output
    projection issued) and router (its norm, mixes and router issued, up to asking for the picks).
    A layer's sum, attn and router are the next layer's (the last layer's sum holds the head)."""
    parts = ("picks", "plan", "wait", "issue", "sum", "attn", "router")
    acc = collections.defaultdict(lambda: dict.fromkeys(parts, 0.0))
    steps = 0
    for s in range(2, len(phase) - 1):
        a, b = phase[s], phase[s + 1]
        thread = rows[a][1]
        mark, prev = {}, None  # this layer's marks; the previous layer's number
        for t, th, ev, L, v in rows[a:b + 1]:
            if th != thread:
                continue
            if ev == "layer_begin" and "moe_end" in mark:
                acc[mark["L"]]["sum"] += t - mark["moe_end"]
                mark["layer_begin"] = t
            elif ev == "attn_end" and "layer_begin" in mark:
                acc[mark["L"]]["attn"] += t - mark["layer_begin"]
                mark["attn_end"] = t
            elif ev == "picks_wait":
                if "attn_end" in mark:
                    acc[mark["L"]]["router"] += t - mark["attn_end"]
                mark = {"L": L, "picks_wait": t}
            elif ev == "need" and "picks_wait" in mark:
                acc[L]["picks"] += t - mark["picks_wait"]
                mark["need"] = t
            elif ev == "wait_begin" and "need" in mark:
                if "first_wait" not in mark:
                    mark["first_wait"] = t
                    acc[L]["plan"] += t - mark["need"]
                mark["began"] = t
            elif ev == "wait_end" and "began" in mark:
                acc[L]["wait"] += t - mark.pop("began")
                mark["last_end"] = t
            elif ev == "moe_end" and "need" in mark:
                acc[L]["issue"] += t - mark.get("last_end", mark.get("first_wait", mark["need"]))
                mark["moe_end"] = t
        steps += 1
    if steps == 0:
        return
    print(f"forward thread per layer over {steps} steps (a step's mean, us): " + ", ".join(parts))
    total = dict.fromkeys(parts, 0.0)
    for L in sorted(acc):
        row = acc[L]
        for k in parts:
            total[k] += row[k] / steps
        print(f"  L{L:<3d} " + " ".join(f"{row[k] / steps:8.0f}" for k in parts))
    print("  all  " + " ".join(f"{total[k]:8.0f}" for k in parts))


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
    if "--layers" in sys.argv and phases:
        layer_profile(rows, phases[0])
    if "--host" in sys.argv and phases:
        host_profile(rows, phases[0])
    if "--step" in sys.argv and phases:
        k = int(sys.argv[sys.argv.index("--step") + 1])
        a, b = phases[0][k], phases[0][k + 1]
        t0 = rows[a][0]
        for t, th, ev, layer, value in rows[a:b]:
            print(f"{t - t0:9.1f} t{th} {ev:12s} L{layer:<3d} {value}")


if __name__ == "__main__":
    main()
