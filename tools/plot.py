#!/usr/bin/python3
"""tools/plot.py: charts of apps/loader_bench CSV files (PNG, matplotlib).

    tools/plot.py --csv out/loader/throughput.csv --out out/loader/throughput.png
    tools/plot.py --csv out/loader/train.csv --out out/loader/train.png
    tools/plot.py --csv a.csv --csv b.csv --out both.png      (rows of several files together)

The kind of chart follows from the CSV's columns (loader_bench writes three kinds):
  throughput  (images_per_sec, no loader_wait_fraction): images/s of the loader alone vs
              workers, one line per dataset, log scale (the datasets differ by 10-100x);
  train       (loader_wait_fraction): two panels vs workers: the loader wait fraction (%)
              and the median step time (ms), one line per (dataset, extra decode us);
  h2d         (pinned_gb_per_s): host-to-device GB/s vs copy size, pageable and pinned.
Rows measured on the CUDA simulator (column simulated = 1) are labelled SIMULATED.

Runs with the system Python (/usr/bin/python3 and Debian's python3-matplotlib, which
tools/setup.sh installs with KILN_SETUP_EXTRAS=1); uses nothing but the standard library and
matplotlib.
"""
import argparse
import csv
import sys
from collections import OrderedDict

try:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot.py: matplotlib is missing: apt-get install python3-matplotlib "
             "(or KILN_SETUP_EXTRAS=1 tools/setup.sh), and run it with /usr/bin/python3")


def read_rows(paths):
    rows, columns = [], None
    for path in paths:
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                if columns is None:
                    columns = reader.fieldnames
                elif reader.fieldnames != columns:
                    sys.exit("plot.py: %s has other columns than %s: plot one kind of CSV at a "
                             "time" % (path, paths[0]))
                rows.extend(reader)
        except OSError as e:
            sys.exit("plot.py: cannot read %s: %s" % (path, e.strerror))
    if not rows:
        sys.exit("plot.py: no rows in %s" % ", ".join(paths))
    return columns, rows


def simulated(rows):
    return any(r.get("simulated") == "1" for r in rows)


def group(rows, key):
    """Rows grouped by key(row), in first-seen order, each group sorted by workers."""
    groups = OrderedDict()
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    for k in groups:
        groups[k].sort(key=lambda r: int(r["workers"]))
    return groups


def plot_throughput(rows, title):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for dataset, rs in group(rows, lambda r: r["dataset"]).items():
        workers = [int(r["workers"]) for r in rs]
        ips = [float(r["images_per_sec"]) for r in rs]
        ax.plot(workers, ips, marker="o", label=dataset)
        for w, v in zip(workers, ips):
            ax.annotate("%.0fk" % (v / 1e3) if v >= 1e4 else "%.1fk" % (v / 1e3), (w, v),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    if any(r["dataset"] == "mnist-idx" for r in rows):
        ax.axhline(1e5, color="grey", linestyle="--", linewidth=1)
        ax.text(0.99, 1e5, "100k images/s target (MNIST IDX, 2 workers)", color="grey",
                fontsize=7, ha="right", va="bottom", transform=ax.get_yaxis_transform())
    ax.set_yscale("log")
    ax.set_xlabel("loader workers (0 = synchronous, in the consumer's thread)")
    ax.set_ylabel("images / s (log scale)")
    ax.set_xticks(sorted({int(r["workers"]) for r in rows}))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    r0 = rows[0]
    ax.set_title(title or "Loader alone: batch %s, prefetch %s" % (r0["batch_size"], r0["prefetch"]))
    return fig


def plot_train(rows, title):
    fig, (ax_wait, ax_step) = plt.subplots(1, 2, figsize=(10, 4.2))
    groups = group(rows, lambda r: (r["dataset"], r["extra_decode_us"], r["device"], r["threads"]))
    for (dataset, extra, device, threads), rs in groups.items():
        label = "%s%s, %s, %s compute thread%s" % (
            dataset, " +%s us/img" % extra if extra != "0" else "", device, threads,
            "" if threads == "1" else "s")
        workers = [int(r["workers"]) for r in rs]
        wait = [100 * float(r["loader_wait_fraction"]) for r in rs]
        step = [float(r["median_step_ms"]) for r in rs]
        ax_wait.plot(workers, wait, marker="o", label=label)
        ax_step.plot(workers, step, marker="o", label=label)
        for w, v in zip(workers, wait):
            ax_wait.annotate("%.1f%%" % v, (w, v), textcoords="offset points", xytext=(0, 6),
                             ha="center", fontsize=8)
        for w, v in zip(workers, step):
            ax_step.annotate("%.0f" % v, (w, v), textcoords="offset points", xytext=(0, 6),
                             ha="center", fontsize=8)
    ax_wait.axhline(5, color="grey", linestyle="--", linewidth=1)
    ax_wait.text(0.99, 5, "5% target", color="grey", fontsize=7, ha="right", va="bottom",
                 transform=ax_wait.get_yaxis_transform())
    xt = sorted({int(r["workers"]) for r in rows})
    for ax in (ax_wait, ax_step):
        ax.set_xlabel("loader workers")
        ax.set_xticks(xt)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_wait.set_ylabel("loader wait fraction (%)")
    ax_wait.set_title("Time the training loop waits for data")
    ax_step.set_ylabel("median step time (ms)")
    ax_step.set_title("Training step time")
    ax_wait.legend(fontsize=8)
    r0 = rows[0]
    fig.suptitle(title or "Seed CNN trained from MNIST PNGs, batch %s, %s steps per run" %
                 (r0["batch_size"], r0["steps"]))
    return fig


def plot_h2d(rows, title):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    mb = [float(r["size_mb"]) for r in rows]
    ax.plot(mb, [float(r["pageable_gb_per_s"]) for r in rows], marker="o", label="pageable")
    ax.plot(mb, [float(r["pinned_gb_per_s"]) for r in rows], marker="o", label="pinned")
    ax.set_xscale("log", base=2)
    ax.set_xticks(mb)
    ax.set_xticklabels(["%g" % m for m in mb])
    ax.set_xlabel("copy size (MB)")
    ax.set_ylabel("host -> device GB/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(title or "Host-to-device bandwidth: pageable vs pinned")
    return fig


def main():
    p = argparse.ArgumentParser(description="Charts of apps/loader_bench CSV files")
    p.add_argument("--csv", action="append", required=True,
                   help="a loader_bench CSV (repeat to plot the rows of several files together)")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--title", default="", help="chart title (default: from the data)")
    p.add_argument("--dpi", type=int, default=80)
    a = p.parse_args()
    columns, rows = read_rows(a.csv)
    if "loader_wait_fraction" in columns:
        fig = plot_train(rows, a.title)
    elif "pinned_gb_per_s" in columns:
        fig = plot_h2d(rows, a.title)
    elif "images_per_sec" in columns:
        fig = plot_throughput(rows, a.title)
    else:
        sys.exit("plot.py: %s is not a loader_bench CSV (columns: %s)" % (a.csv[0], columns))
    if simulated(rows):
        fig.text(0.5, 0.5, "SIMULATED", fontsize=40, color="red", alpha=0.25, ha="center",
                 va="center", rotation=20)
    fig.tight_layout()
    try:
        fig.savefig(a.out, dpi=a.dpi)
    except OSError as e:
        sys.exit("plot.py: cannot write %s: %s" % (a.out, e.strerror))
    print("plot.py: wrote %s (%d rows)" % (a.out, len(rows)))


if __name__ == "__main__":
    main()
