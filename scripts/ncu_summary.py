#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log by kernel: launches, total and mean
device time, share of the whole. Usage: scripts/ncu_summary.py NCU.csv [--per N] (N: divide the
launches and totals by N, e.g. the profiled forwards, to print them per step)."""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    per = float(sys.argv[sys.argv.index('--per') + 1]) if '--per' in sys.argv else 1.0
    header = None
    totals = collections.defaultdict(lambda: [0, 0.0])
    with open(path, newline='') as f:
        for row in csv.reader(f):
            if 'Kernel Name' in row:
                header = row
                continue
            if header is None or len(row) != len(header):
                continue
            d = dict(zip(header, row))
            if d.get('Metric Name') != 'gpu__time_duration.sum':
                continue
            name = d['Kernel Name'].split('(')[0].split('<')[0].replace('void ', '').strip()
            name = name.split('::')[-1]
            try:
                ns = float(d['Metric Value'].replace(',', ''))
            except ValueError:
                continue
            totals[name][0] += 1
            totals[name][1] += ns
    whole = sum(t for _, t in totals.values())
    print('%.1f us over %d kernels%s' % (whole / 1e3 / per, sum(n for n, _ in totals.values()) / per,
                                         ' (per step: divided by %g)' % per if per != 1 else ''))
    for name, (n, t) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print('%-34s %8.1f launches %10.1f us %8.2f us each %6.1f%%' % (name, n / per, t / 1e3 / per, t / 1e3 / n,
                                                                        100 * t / whole))


if __name__ == '__main__':
    main()
