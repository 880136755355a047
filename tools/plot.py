#!/usr/bin/python3
"""tools/plot.py: charts of apps/loader_bench, apps/comm_bench and the ResNet benchmark's CSV
files, and Gantt charts of Kiln's Chrome traces (PNG, matplotlib).

    tools/plot.py --csv out/loader/throughput.csv --out out/loader/throughput.png
    tools/plot.py --csv out/loader/train.csv --out out/loader/train.png
    tools/plot.py --csv out/comm/mpi2.csv --out out/comm/mpi2.png
    tools/plot.py --csv out/comm/ranks.csv --out docs/img/comm_ranks.png   (one size, N = 2..16)
    tools/plot.py --csv a.csv --csv b.csv --out both.png      (rows of several files together)
    tools/plot.py --trace run.json --out gantt.png [--step K]  (mnist_train --trace run.json)
    tools/plot.py --lr-schedules --out docs/img/lr_schedules.png

The kind of chart follows from the CSV's columns (loader_bench writes three kinds):
  throughput  (images_per_sec, no loader_wait_fraction): images/s of the loader alone vs
              workers, one line per dataset, log scale (the datasets differ by 10-100x);
  train       (loader_wait_fraction): two panels vs workers: the loader wait fraction (%)
              and the median step time (ms), one line per (dataset, extra decode us);
  h2d         (pinned_gb_per_s): host-to-device GB/s vs copy size, pageable and pinned.
and comm_bench three:
  comm sweep  (busbw_gbs): two panels vs message size (log 2 x axis): busbw (GB/s) and time
              per allreduce (us, log), one line per (transport, ranks, algorithm, dtype);
  comm ranks  (busbw_gbs, one message size, several rank counts: comm_bench runs appended into
              one CSV): two panels vs ranks N: the bytes the busiest rank sent, in units of
              the message size K, with the mean over ranks 2(N-1)/N that every algorithm
              shares; and the median time per allreduce (ms), one line per algorithm;
  ps scaling  (server_bytes_received): two panels vs workers W: time per allreduce of the ring
              and of the parameter server with one dedicated server, and the bytes a ring rank
              sends, a PS worker sends and the PS server receives per allreduce.
and apps/resnet_bench one:
  model parallel (micro_batches): two panels: seconds per step of one device, naive model
              parallelism and each pipeline schedule at its best split (bars, speedup over the
              first); seconds per step vs split size (log 2 x axis), one line per schedule
              (columns schedule and chunks; CSVs without them read as gpipe, one chunk), one
              device and naive as lines;
and tools/bench_resnet_vs_pytorch.sh one:
  runners     (runner, workload, images_per_sec): grouped bars, images/s of each runner
              (Kiln's and PyTorch's setups) per workload.
and tools/recipe_experiment.sh one:
  recipe      (recipe, train_seconds, test_accuracy): test accuracy (%) vs cumulative seconds
              of training (evaluation excluded), one line per run, one colour per recipe, the
              99.0% bar dashed.
Rows measured on the CUDA simulator (column simulated = 1) are labelled SIMULATED.

A trace (--trace: the Chrome trace JSON of engine/trace.h) gives one kind:
  gantt       one row per thread that recorded spans, labelled with its thread name and device
              ("stage 0 (cpu:0)", "thread 2 (cuda:1)"); a box per span, coloured by phase
              (forward, backward, weight, recompute, send/receive, optimizer, allreduce,
              loader_wait, h2d; a zero-bubble pipeline's backward is its input-gradient half B
              and weight its weight-gradient half W); forward, backward and weight boxes carry
              their micro-batch number when they have one, and boxes of model chunk 1 and up
              (args.chunk, interleaved pipelines) are hatched; x axis in ms from the first
              span shown. --step K keeps the spans of step K
              (args.step) and the spans without a step that overlap them (allreduce buckets).

--lr-schedules draws learning rate vs optimizer step of mnist_train's one-cycle schedule (the
fast recipe: Adam, peak 0.005, 3 epochs of 469 steps) and of its cyclic schedule (SGD --lr 0.05,
--half-cycle-epochs 1, triangular and triangular2, 6 epochs), from the closed forms of
engine/optim/lr_schedule.h (whose unit tests check them against PyTorch's schedulers).

Runs with the system Python (/usr/bin/python3 and Debian's python3-matplotlib, which
tools/setup.sh installs with KILN_SETUP_EXTRAS=1); uses nothing but the standard library and
matplotlib.
"""
import argparse
import csv
import json
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
    if any(r["dataset"] in ("idx", "mnist-idx") for r in rows):  # mnist-idx: older CSVs
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
    fig.suptitle(title or "MNIST CNN trained from MNIST PNGs, batch %s, %s steps per run" %
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


def size_label(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div:
            return "%g%s" % (b / div, unit)
    return "%d" % b


def plot_comm_sweep(rows, title):
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(11, 4.5))
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r["transport"], r["members"], r["algorithm"], r["dtype"]), []).append(r)
    many = len({(k[0], k[1], k[3]) for k in groups}) > 1
    for (transport, members, alg, dtype), rs in groups.items():
        rs.sort(key=lambda r: int(r["bytes"]))
        x = [int(r["bytes"]) for r in rs]
        label = alg + (" (%s, %s ranks, %s)" % (transport, members, dtype) if many else "")
        ax_bw.plot(x, [float(r["busbw_gbs"]) for r in rs], marker="o", markersize=3, label=label)
        ax_t.plot(x, [float(r["time_us"]) for r in rs], marker="o", markersize=3, label=label)
    xs = sorted({int(r["bytes"]) for r in rows})
    step = max(1, -(-len(xs) // 9))  # at most 9 labels
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs[::step])
        ax.set_xticklabels([size_label(b) for b in xs[::step]])
        ax.set_xlabel("message size K (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    ax_bw.set_ylim(bottom=0)
    ax_bw.set_ylabel("busbw = K/t * 2(N-1)/N  (GB/s)")
    ax_bw.set_title("Bus bandwidth (higher is better)")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per allreduce (us, log)")
    ax_t.set_title("Time of the slowest rank")
    ax_bw.legend(fontsize=8)
    r0 = rows[0]
    fig.suptitle(title or "Allreduce (sum, %s) over %s ranks, transport %s" %
                 (r0["dtype"], r0["members"], r0["transport"]))
    return fig


def plot_comm_ranks(rows, title):
    fig, (ax_b, ax_t) = plt.subplots(1, 2, figsize=(11, 4.5))
    groups = OrderedDict()
    for r in rows:
        groups.setdefault(r["algorithm"], []).append(r)
    markers = {"ring": "o", "hd": "s", "bb": "^", "ps": "D"}
    for alg, rs in groups.items():
        rs.sort(key=lambda r: int(r["members"]))
        n = [int(r["members"]) for r in rs]
        if all(r["bytes_per_rank_max"] for r in rs):
            ax_b.plot(n, [float(r["bytes_per_rank_max"]) / int(r["bytes"]) for r in rs],
                      marker=markers.get(alg, "o"), label=alg + ": busiest rank")
        ax_t.plot(n, [float(r["median_us"]) / 1e3 for r in rs], marker=markers.get(alg, "o"),
                  label=alg)
    ns = sorted({int(r["members"]) for r in rows})
    ax_b.plot(ns, [2.0 * (x - 1) / x for x in ns], linestyle="--", color="gray",
              label="mean over ranks, every algorithm: 2(N-1)/N")
    for ax in (ax_b, ax_t):
        ax.set_xlabel("ranks N")
        ax.set_xticks(ns)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_b.set_ylabel("bytes sent per allreduce / K")
    ax_b.set_title("Bytes sent by the busiest rank (measured)")
    ax_t.set_ylabel("median time per allreduce (ms)")
    ax_t.set_title("Time of the slowest rank")
    r0 = rows[0]
    fig.suptitle(title or "Allreduce of %siB (%s) over N ranks, transport %s" %
                 (size_label(int(r0["bytes"])), r0["dtype"], r0["transport"]))
    return fig


def plot_ps_scaling(rows, title):
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.5))
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r["transport"], r["algorithm"]), []).append(r)
    transports = list(OrderedDict((k[0], 1) for k in groups))
    styles = ["-", "--", ":", "-."]
    mib = float(1 << 20)
    for (transport, alg), rs in groups.items():
        rs.sort(key=lambda r: int(r["workers"]))
        w = [int(r["workers"]) for r in rs]
        ls = styles[transports.index(transport) % len(styles)]
        suffix = " (%s)" % transport if len(transports) > 1 else ""
        if alg == "ps":
            ax_t.plot(w, [float(r["time_us"]) / 1e3 for r in rs], marker="o", linestyle=ls,
                      color="tab:red", label="parameter server, 1 server" + suffix)
            ax_b.plot(w, [float(r["server_bytes_received"]) / mib for r in rs], marker="o",
                      linestyle=ls, color="tab:red", label="PS server: received, W K" + suffix)
            ax_b.plot(w, [float(r["worker_bytes_sent"]) / mib for r in rs], marker="s",
                      linestyle=ls, color="tab:orange", label="PS worker: sent, K" + suffix)
        else:
            ax_t.plot(w, [float(r["time_us"]) / 1e3 for r in rs], marker="o", linestyle=ls,
                      color="tab:blue", label=alg + suffix)
            ax_b.plot(w, [float(r["worker_bytes_sent"]) / mib for r in rs], marker="o",
                      linestyle=ls, color="tab:blue",
                      label="%s rank: sent, 2(W-1)K/W%s" % (alg, suffix))
    for ax in (ax_t, ax_b):
        ax.set_xlabel("workers W")
        ax.set_xticks(sorted({int(r["workers"]) for r in rows}))
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_ylabel("time per allreduce (ms)")
    ax_t.set_title("Time of the slowest worker")
    ax_b.set_ylabel("MiB per allreduce")
    ax_b.set_title("Bytes on the wire")
    r0 = rows[0]
    fig.suptitle(title or "Parameter server bottleneck: allreduce of %siB (%s), %s" %
                 (size_label(int(r0["bytes"])), r0["dtype"], " and ".join(transports)))
    return fig


def plot_runners(rows, title):
    workloads = list(OrderedDict.fromkeys(r["workload"] for r in rows))
    runners = list(OrderedDict.fromkeys(r["runner"] for r in rows))
    value = {(r["workload"], r["runner"]): float(r["images_per_sec"]) for r in rows}
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 4.2))
    axes = axes if len(workloads) > 1 else [axes]
    colors = {rn: ("tab:orange" if rn.startswith("pytorch") else "tab:blue") for rn in runners}
    for ax, w in zip(axes, workloads):
        names = [rn for rn in runners if (w, rn) in value]
        ys = [value[(w, rn)] for rn in names]
        bars = ax.bar(range(len(names)), ys, color=[colors[rn] for rn in names])
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y, "%.0f" % y, ha="center", va="bottom",
                    fontsize=8)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax.set_title(w, fontsize=10)
        ax.set_ylabel("images/s (median)")
    fig.suptitle(title or "Kiln (blue) vs PyTorch (orange)")
    return fig


def schedule_of(r):
    """A pipeline row's schedule as drawn: "gpipe", "interleaved v2". CSVs written before the
    chunks column (or the schedule column) exist read as one piece per device."""
    name = r.get("schedule") or "gpipe"
    chunks = int(r.get("chunks") or 1)
    return "%s v%d" % (name, chunks) if chunks > 1 else name


def plot_model_parallel(rows, title):
    """resnet_bench: the tutorial's two charts. Left: step time of one device, naive model
    parallelism and each schedule's best pipeline split (mean +- std); right: step time vs
    split size, one line per schedule."""
    f = lambda r, k: float(r[k])
    singles = [r for r in rows if r["mode"] == "single"]
    naive = [r for r in rows if r["mode"] == "model-parallel"]
    pipes = sorted((r for r in rows if r["mode"] == "pipeline"), key=lambda r: int(r["split_size"]))
    by_schedule = OrderedDict()
    for r in rows:  # in the CSV's order: the order of --schedule
        if r["mode"] == "pipeline":
            by_schedule.setdefault(schedule_of(r), [])
    for r in pipes:
        by_schedule[schedule_of(r)].append(r)
    bars = singles + naive
    for name, rs in by_schedule.items():
        best = min(rs, key=lambda r: f(r, "step_s_mean"))
        bars.append(dict(best, label="pipeline %s (best: split %s)" % (name, best["split_size"])))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    base = f(bars[0], "step_s_mean") if bars else 1.0
    ys = [f(r, "step_s_mean") for r in bars]
    # Red and gray are the naive and single-device bars': the schedules get the other colours.
    line_colours = dict(zip(by_schedule, ["tab:blue", "tab:orange", "tab:green", "tab:purple",
                                          "tab:brown", "tab:pink", "tab:olive", "tab:cyan"] * 4))
    colors = ["tab:gray" if r["mode"] == "single" else
              "tab:red" if r["mode"] == "model-parallel" else line_colours[schedule_of(r)]
              for r in bars]
    drawn = left.bar(range(len(bars)), ys, yerr=[f(r, "step_s_std") for r in bars], capsize=4,
                     color=colors)
    for b, y in zip(drawn, ys):
        left.text(b.get_x() + b.get_width() / 2, y, "%.2fx" % (base / y), ha="center",
                  va="bottom", fontsize=8)
    left.set_xticks(range(len(bars)))
    left.set_xticklabels([r["label"] for r in bars], rotation=25, ha="right", fontsize=8)
    left.set_ylabel("seconds per step (mean +- std)")
    left.set_title("speedup over the first bar", fontsize=10)
    if pipes:
        xs = sorted({int(r["split_size"]) for r in pipes})
        for name, rs in by_schedule.items():
            right.errorbar([int(r["split_size"]) for r in rs], [f(r, "step_s_mean") for r in rs],
                           yerr=[f(r, "step_s_std") for r in rs], marker="o", capsize=3,
                           color=line_colours[name], label="pipeline %s" % name)
        for r, style in [(singles[0] if singles else None, ":"), (naive[0] if naive else None, "--")]:
            if r:
                right.axhline(f(r, "step_s_mean"), linestyle=style, color="gray", label=r["label"])
        right.set_xscale("log", base=2)
        right.set_xticks(xs)
        right.set_xticklabels([str(x) for x in xs])
        right.set_xlabel("split size (rows per micro-batch)")
        right.set_ylabel("seconds per step")
        right.legend(fontsize=8)
        right.set_title("step time vs split size", fontsize=10)
    r0 = rows[0]
    fig.suptitle(title or "%s, %sx%s images, batch %s" % (r0["model"], r0["image"], r0["image"],
                                                          r0["batch"]))
    return fig


# ---- Gantt chart of a Chrome trace (engine/trace.h) -------------------------------------------

# A zero-bubble schedule splits each backward into "backward" (B: the input gradient, which the
# previous stage waits for) and "weight" (W: the weight gradient); other schedules have no W.
PHASE_COLOURS = OrderedDict([
    ("forward", "#4c72b0"), ("backward", "#dd8452"), ("weight", "#2ca9b8"), ("recompute", "#8172b3"),
    ("send", "#937860"), ("receive", "#e6e6e6"), ("optimizer", "#55a868"),
    ("allreduce", "#c44e52"), ("loader_wait", "#8c8c8c"), ("h2d", "#da8bc3"),
    ("other", "#ccb974"),
])


def plot_recipe(rows, title):
    """tools/recipe_experiment.sh: test accuracy vs training seconds, every run of each recipe."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"default": "tab:blue", "fast": "tab:orange"}
    labelled = set()
    runs = OrderedDict()
    for r in rows:
        runs.setdefault((r["recipe"], r["run"]), []).append(r)
    lowest = 100.0
    for (recipe, run), rs in runs.items():
        rs.sort(key=lambda r: int(r["epoch"]))
        xs = [float(r["train_seconds"]) for r in rs]
        ys = [100 * float(r["test_accuracy"]) for r in rs]
        lowest = min(lowest, min(ys))
        label = None if recipe in labelled else "--recipe " + recipe
        labelled.add(recipe)
        ax.plot(xs, ys, "o-", color=colors.get(recipe, "tab:gray"), label=label, alpha=0.8,
                markersize=4)
    ax.axhline(99.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("test accuracy after each epoch (%)")
    if lowest >= 97.0:
        ax.set_ylim(97.0, 99.6)  # the region around the 99.0% bar
    ax.set_xlim(left=0)
    ax.legend()
    ax.set_title(title or "MNIST CNN: default recipe vs --recipe fast")
    return fig


def onecycle_lr(t, max_lr, total, pct_start=0.3, div=25.0, final_div=1e4):
    """OneCycleLR of engine/optim/lr_schedule.h (cos anneal)."""
    import math
    lo, end = max_lr / div, max_lr / div / final_div
    peak = pct_start * total - 1
    s = min(t, total - 1)
    if s <= peak:
        a, b, p = lo, max_lr, s / peak
    else:
        a, b, p = max_lr, end, (s - peak) / (total - 1 - peak)
    return b + (a - b) / 2 * (math.cos(math.pi * p) + 1)


def cyclic_lr(t, base_lr, max_lr, half, halve=False):
    """CyclicLR of engine/optim/lr_schedule.h (symmetric triangles)."""
    import math
    size, ratio = 2.0 * half, 0.5
    cycle = math.floor(1 + t / size)
    x = 1 + t / size - cycle
    scale = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
    h = (max_lr - base_lr) * scale
    return base_lr + (h / 2 ** (cycle - 1) if halve else h)


def plot_lr_schedules(title):
    steps = 469  # optimizer steps per epoch: 60,000 images in batches of 128
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    total = 3 * steps
    a1.plot(range(total), [onecycle_lr(t, 0.005, total) for t in range(total)], color="tab:orange")
    a1.set_title("--lr-schedule onecycle (--recipe fast: Adam, peak 0.005)", fontsize=10)
    total = 6 * steps
    a2.plot(range(total), [cyclic_lr(t, 0.0125, 0.05, steps) for t in range(total)],
            label="triangular")
    a2.plot(range(total), [cyclic_lr(t, 0.0125, 0.05, steps, True) for t in range(total)],
            label="triangular2", linestyle="--")
    a2.set_title("--lr-schedule cyclic (SGD --lr 0.05, base 0.0125)", fontsize=10)
    a2.legend(fontsize=8)
    for ax in (a1, a2):
        ax.set_xlabel("optimizer step (%d per epoch)" % steps)
        ax.set_ylabel("learning rate")
    if title:
        fig.suptitle(title)
    return fig


def read_trace(path):
    """The complete events, and the rows' names and order, of a Chrome trace file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        sys.exit("plot.py: cannot read %s: %s" % (path, e.strerror))
    except ValueError as e:
        sys.exit("plot.py: %s is not JSON: %s" % (path, e))
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    spans = [e for e in events if e.get("ph") == "X"]
    processes, threads, order = {}, {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        if e.get("name") == "process_name":
            processes[e["pid"]] = e["args"]["name"]
        elif e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e.get("name") == "thread_sort_index":
            order[(e["pid"], e["tid"])] = e["args"]["sort_index"]
    return spans, processes, threads, order


def spans_of_step(spans, step, path):
    """The spans of step `step`, and the spans without a step that overlap them; and the
    step's window (start, end) in us."""
    own = [e for e in spans if e.get("args", {}).get("step") == step]
    if not own:
        steps = sorted({e["args"]["step"] for e in spans if "step" in e.get("args", {})})
        sys.exit("plot.py: %s has no span of step %d (steps: %s)" %
                 (path, step, ", ".join(map(str, steps)) or "none"))
    start = min(e["ts"] for e in own)
    end = max(e["ts"] + e.get("dur", 0) for e in own)
    stepless = [e for e in spans if "step" not in e.get("args", {}) and
                e["ts"] < end and e["ts"] + e.get("dur", 0) > start]
    return own + stepless, (start, end)


def plot_gantt(path, step, title):
    spans, processes, threads, order = read_trace(path)
    if not spans:
        sys.exit("plot.py: %s holds no spans (was the run traced?)" % path)
    if step is not None:
        spans, (t0, t1) = spans_of_step(spans, step, path)  # stepless spans are cut to it
    else:
        t0 = min(e["ts"] for e in spans)
        t1 = max(e["ts"] + e.get("dur", 0) for e in spans)
    rows = sorted({(e["pid"], e["tid"]) for e in spans},
                  key=lambda r: (r[0], order.get(r, 1000 + r[1]), r[1]))
    row_of = {r: i for i, r in enumerate(rows)}
    width_ms = max((t1 - t0) / 1e3, 1e-3)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * len(rows)))
    seen = set()
    has_weight = any(e.get("args", {}).get("phase") == "weight" for e in spans)
    chunks = sorted({e["args"]["chunk"] for e in spans if "chunk" in e.get("args", {})})
    # Longest first, so a span nested in another (h2d in a loader wait) is drawn on top of it.
    for e in sorted(spans, key=lambda e: -e.get("dur", 0)):
        args = e.get("args", {})
        phase = args.get("phase", e.get("cat", "other"))
        colour = PHASE_COLOURS.get(phase, PHASE_COLOURS["other"])
        start, dur = (e["ts"] - t0) / 1e3, e.get("dur", 0) / 1e3
        y = row_of[(e["pid"], e["tid"])]
        # A receive span is mostly waiting for the neighbour stage: the bubble, drawn pale.
        legend = "receive (waiting)" if phase == "receive" else \
            "backward (B)" if phase == "backward" and has_weight else \
            "weight (W)" if phase == "weight" else phase
        # Interleaved schedules: the passes of the device's later model chunks hatched.
        hatch = "//" if args.get("chunk", 0) > 0 and \
            phase in ("forward", "backward", "weight", "recompute") else None
        ax.broken_barh([(start, dur)], (y - 0.4, 0.8), facecolors=colour, edgecolor="white",
                       linewidth=0.3, hatch=hatch, label=None if legend in seen else legend)
        seen.add(legend)
        if phase in ("forward", "backward", "weight") and "micro_batch" in args and \
                dur > 0.012 * width_ms:
            ax.text(start + dur / 2, y, str(args["micro_batch"]), ha="center", va="center",
                    fontsize=7, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(["%s (%s)" % (threads.get(r, "thread %d" % r[1]),
                                     processes.get(r[0], "pid %d" % r[0])) for r in rows])
    ax.invert_yaxis()  # the first row at the top
    ax.set_xlim(0, width_ms)
    ax.set_xlabel("ms from the %s start" % ("step's" if step is not None else "trace's"))
    ax.grid(axis="x", alpha=0.3)
    names = ["forward", "backward (B)", "backward", "weight (W)"] + list(PHASE_COLOURS)[3:] + \
        ["send/receive"]
    if len(chunks) > 1:  # a legend entry for the hatching
        ax.broken_barh([(0, 0)], (0, 0), facecolors="white", edgecolor="black", hatch="//",
                       label="chunk >= 1 (hatched)")
        names.append("chunk >= 1 (hatched)")
    handles, labels = ax.get_legend_handles_labels()
    legend = sorted(zip(labels, handles),
                    key=lambda lh: names.index(lh[0]) if lh[0] in names else len(names))
    ax.legend([h for _, h in legend], [l for l, _ in legend], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.suptitle(title or ("%s, step %d" % (path, step) if step is not None else path))
    return fig, len(spans)


def main():
    p = argparse.ArgumentParser(description="Charts of apps/loader_bench and apps/comm_bench "
                                "CSV files, and Gantt charts of Kiln's Chrome traces")
    p.add_argument("--csv", action="append",
                   help="a loader_bench or comm_bench CSV (repeat to plot the rows of several "
                   "files together)")
    p.add_argument("--trace", help="a Chrome trace JSON written by Kiln's tracer (mnist_train "
                   "--trace): a Gantt chart")
    p.add_argument("--step", type=int, help="with --trace: only the spans of this step")
    p.add_argument("--lr-schedules", action="store_true", help="learning rate vs step of "
                   "mnist_train's one-cycle and cyclic schedules")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--title", default="", help="chart title (default: from the data)")
    p.add_argument("--dpi", type=int, default=80)
    a = p.parse_args()
    if a.lr_schedules:
        if a.csv or a.trace:
            p.error("--lr-schedules takes no --csv or --trace")
        save(plot_lr_schedules(a.title), a.out, a.dpi)
        print("plot.py: wrote %s" % a.out)
        return
    if bool(a.csv) == bool(a.trace):
        p.error("give either --csv (one or more), --trace or --lr-schedules")
    if a.step is not None and not a.trace:
        p.error("--step goes with --trace")
    if a.trace:
        fig, n = plot_gantt(a.trace, a.step, a.title)
        save(fig, a.out, a.dpi)
        print("plot.py: wrote %s (%d spans)" % (a.out, n))
        return
    columns, rows = read_rows(a.csv)
    if "recipe" in columns:
        fig = plot_recipe(rows, a.title)
    elif "micro_batches" in columns:
        fig = plot_model_parallel(rows, a.title)
    elif "busbw_gbs" in columns and len({r["members"] for r in rows}) > 1 and \
            len({r["bytes"] for r in rows}) == 1:
        fig = plot_comm_ranks(rows, a.title)
    elif "busbw_gbs" in columns:
        fig = plot_comm_sweep(rows, a.title)
    elif "server_bytes_received" in columns:
        fig = plot_ps_scaling(rows, a.title)
    elif "loader_wait_fraction" in columns:
        fig = plot_train(rows, a.title)
    elif "runner" in columns:
        fig = plot_runners(rows, a.title)
    elif "pinned_gb_per_s" in columns:
        fig = plot_h2d(rows, a.title)
    elif "images_per_sec" in columns:
        fig = plot_throughput(rows, a.title)
    else:
        sys.exit("plot.py: %s is not a loader_bench or comm_bench CSV (columns: %s)" %
                 (a.csv[0], columns))
    if simulated(rows):
        fig.text(0.5, 0.5, "SIMULATED", fontsize=40, color="red", alpha=0.25, ha="center",
                 va="center", rotation=20)
    save(fig, a.out, a.dpi)
    print("plot.py: wrote %s (%d rows)" % (a.out, len(rows)))


def save(fig, out, dpi):
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=dpi)
    except OSError as e:
        sys.exit("plot.py: cannot write %s: %s" % (out, e.strerror))


if __name__ == "__main__":
    main()
