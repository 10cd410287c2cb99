#!/usr/bin/env python3
"""Plots the overload benchmark's halving run: the client's limit and the latency of successes
over time, one panel per limiting, from the CSV files `overload-benchmark` writes.

    python3 Scripts/plot-overload.py overload-results overload.png

Needs matplotlib (`pip install matplotlib`); the benchmark itself does not.
"""
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

folder = Path(sys.argv[1] if len(sys.argv) > 1 else "overload-results")
output = Path(sys.argv[2] if len(sys.argv) > 2 else folder / "overload.png")
runs = [("none", "no limit"), ("gradient", "gradient (default)"), ("aimd", "AIMD")]
runs += [(path.name[len("halving-"):-len("-limits.csv")], "best static limit")
         for path in sorted(folder.glob("halving-static-*-limits.csv"))]


def read(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


def p99_by_bin(samples, width=0.25):
    """The p99 latency of successes per bin of arrival time."""
    bins = {}
    for row in samples:
        if row["outcome"] != "ok":
            continue
        bins.setdefault(int(float(row["arrival_s"]) / width), []).append(float(row["latency_ms"]))
    points = []
    for index in sorted(bins):
        values = sorted(bins[index])
        points.append(((index + 0.5) * width, values[min(len(values) - 1, int(len(values) * 0.99))]))
    return points


figure, axes = plt.subplots(len(runs), 1, figsize=(10, 2.6 * len(runs)), sharex=True)
for axis, (name, title) in zip(axes, runs):
    limits = read(folder / f"halving-{name}-limits.csv")
    samples = read(folder / f"halving-{name}-samples.csv")
    times = [float(row["time_s"]) for row in limits]
    in_flight = [int(row["in_flight"]) for row in limits]
    axis.plot(times, in_flight, color="tab:gray", linewidth=0.8, label="client in flight")
    if limits and limits[0]["limit"]:
        axis.plot(times, [int(row["limit"]) for row in limits], color="tab:blue", linewidth=1.5, label="limit")
    axis.set_ylabel("requests")
    axis.set_title(f"{title} ({name})" if name.startswith("static") else title, fontsize=10)
    latency = axis.twinx()
    points = p99_by_bin(samples)
    latency.plot([t for t, _ in points], [v for _, v in points], color="tab:red", linewidth=1.2, label="p99 latency (250 ms bins)")
    latency.set_ylabel("p99 ms", color="tab:red")
    latency.set_ylim(bottom=0)
    axis.set_ylim(bottom=0)
    axis.axvline(x=max(times) / 2 if times else 0, color="black", linestyle="--", linewidth=0.8)
    handles = axis.get_legend_handles_labels()
    more = latency.get_legend_handles_labels()
    axis.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left", fontsize=8)
axes[-1].set_xlabel("seconds (dashed: the upstream's workers halve)")
figure.tight_layout()
figure.savefig(output, dpi=80)
print(f"wrote {output}")
