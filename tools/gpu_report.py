#!/usr/bin/env python3
"""tools/gpu_report.py: the report of tools/gpu_check.sh (report.md and report.json) from the
steps it recorded in REPORT_DIR (steps.tsv, info.txt, logs/, the benchmarks' JSON files, the
ctest runs' JUnit files): every step, the failed tests' output, the sanitizer runs' summaries,
the benchmarks (the GEMM ladder: tools/gpu_report_gemm.py), and what was not run or not
finished with the command that runs it.

    tools/gpu_report.py REPORT_DIR EPOCHS

Any python3, standard library only (the GPU machine's own Python).
"""
import json, os, re, statistics, sys
import xml.etree.ElementTree as ET

import gpu_report_gemm  # the GEMM ladder and its targets (tools/gpu_report_gemm.py)

rdir, epochs = sys.argv[1], int(sys.argv[2])
info = {}
for line in open(os.path.join(rdir, "info.txt")):
    if "=" in line:
        k, v = line.rstrip("\n").split("=", 1)
        info[k] = v
steps = {}
for line in open(os.path.join(rdir, "steps.tsv")):
    f = line.rstrip("\n").split("\t")
    if len(f) >= 6:
        steps[f[0]] = {"status": f[1], "exit_code": f[2], "seconds": f[3], "log": f[4], "note": f[5]}
order = ["prerequisites", "configure", "build", "ctest_gpu", "ctest_gpu_vendor", "ctest_cpu", "custom_layer",
         "gemm_bench", "gemm_steps", "gemm_steps_8192", "conv_bench", "mnist_vendor", "pytorch", "mnist_hand", "mnist_graph", "resnet_gpu",
         "resnet_graph_fp32", "resnet_graph_tf32", "resnet_graph_bf16", "resnet_graph_fp16", "mp_gpu",
         "mp_cpu", "compute_sanitizer"]
# --only's names for groups of steps: all of them at once, one name.
GROUPS = {"resnet_graph": ["resnet_graph_fp32", "resnet_graph_tf32", "resnet_graph_bf16", "resnet_graph_fp16"]}
SANITIZE = re.compile(r"^sanitize_(memcheck|racecheck|synccheck|initcheck)_(.+)$")
TOOLS = ["memcheck", "racecheck", "synccheck", "initcheck"]

def step_key(kv):
    m = SANITIZE.match(kv[0])
    if m:  # after the probe, by tool, then program
        return (len(order), TOOLS.index(m.group(1)), m.group(2))
    return (order.index(kv[0]) if kv[0] in order else len(order) + 1, 0, kv[0])

steps = dict(sorted(steps.items(), key=step_key))

def load(name):
    p = os.path.join(rdir, name)
    try:
        return json.load(open(p)) if os.path.isfile(p) else None
    except ValueError:
        return None

def log_text(step, keep=200):
    p = os.path.join(rdir, "logs", step + ".log")
    if not os.path.isfile(p):
        return None
    lines = open(p, errors="replace").read().splitlines()
    return lines[-keep:]

def trim(lines, head=50, tail=10):
    """The first HEAD and last TAIL lines, and how many were left out between."""
    if len(lines) <= head + tail + 1:
        return lines
    return lines[:head] + [f"... ({len(lines) - head - tail} lines left out: the whole output is in the log) ..."] + \
        (lines[-tail:] if tail else [])

def mnist_entry(j, label):
    if not j:
        return None
    e = {k: j.get(k) for k in ("test_accuracy", "test_accuracy_per_epoch", "train_images_per_sec",
                               "epoch_seconds", "device", "batch_size", "epochs", "kernels",
                               "torch_version", "train_images", "test_images")
         if k in j}
    secs = j.get("epoch_seconds") or []
    e["median_epoch_seconds"] = statistics.median(secs) if secs else None
    e["label"] = label
    return e

runs = {"kiln_hand": mnist_entry(load("mnist_hand.json"), "Kiln hand"),
        "kiln_vendor": mnist_entry(load("mnist_vendor.json"), "Kiln vendor"),
        "pytorch": mnist_entry(load("pytorch.json"), "PyTorch")}
if runs["pytorch"] and runs["pytorch"].get("torch_version"):
    runs["pytorch"]["label"] = "PyTorch " + runs["pytorch"]["torch_version"]
ratio = {}
kv, pt = runs["kiln_vendor"], runs["pytorch"]
# The epochs the runs really trained (a report rewritten with --only report may not be told).
epochs = next((r["epochs"] for r in (kv, pt, runs["kiln_hand"]) if r and r.get("epochs")), epochs)
if kv and pt and pt.get("train_images_per_sec"):
    ratio["images_per_sec"] = kv["train_images_per_sec"] / pt["train_images_per_sec"]
if kv and pt and pt.get("median_epoch_seconds"):
    ratio["median_epoch_seconds"] = kv["median_epoch_seconds"] / pt["median_epoch_seconds"]

def ctest_summary(step):
    lines = log_text(step, 100000)
    if lines is None:
        return None
    out = {"summary": [l for l in lines if re.search(r"tests passed|tests failed|No tests were found", l)]}
    m = next((re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", l) for l in lines
              if re.search(r"tests passed, \d+ tests? failed out of", l)), None)
    if m:
        out.update(failed=int(m.group(2)), total=int(m.group(3)))
        out["passed"] = out["total"] - out["failed"]
    out["skipped"] = sum(1 for l in lines if "(Skipped)" in l)
    out["failed_tests"] = [l.strip() for l in lines if re.search(r"\s-\s.*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)\)", l)]
    out["failed_output"] = failed_output(step, lines, out["failed_tests"])
    return out

RESULT = re.compile(r"^\s*\d+/\d+ Test +#\d+: (\S+) \.*\s*\*\*\*(\w+)")

def failed_output(step, lines, failed_tests):
    """Each failed test's output, trimmed: from STEP.junit.xml (ctest --output-junit), else from
    the log, where --output-on-failure prints it under the test's result line."""
    reasons = {}
    for l in failed_tests:
        m = re.match(r"\d+ - (\S+) \(([^)]*)\)", l)
        if m:
            reasons[m.group(1)] = m.group(2)
    out = []
    junit = os.path.join(rdir, step + ".junit.xml")
    if os.path.isfile(junit):
        try:
            for tc in ET.parse(junit).getroot().iter("testcase"):
                if tc.get("status") == "fail":
                    text = (tc.findtext("system-out") or "").splitlines()
                    out.append({"name": tc.get("name"), "reason": reasons.get(tc.get("name"), "Failed"),
                                "output": trim(text)})
            return out
        except ET.ParseError:
            out = []
    i = 0
    while i < len(lines):
        m = RESULT.match(lines[i])
        if not m or m.group(2) == "Skipped":
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not (RESULT.match(lines[j]) or re.match(r"\s*Start +\d+:", lines[j])
                                      or re.match(r"\d+% tests passed", lines[j])):
            j += 1
        body = lines[i + 1:j]
        while body and not body[-1].strip():
            body.pop()
        out.append({"name": m.group(1), "reason": reasons.get(m.group(1), m.group(2)), "output": trim(body)})
        i = j
    return out

def sanitizer_runs():
    """Each sanitizer run: tool, program, status, its summary line and its first reports."""
    runs = []
    for name, s in steps.items():
        m = SANITIZE.match(name)
        if not m:
            continue
        lines = log_text(name, 100000) or []
        summary = [re.sub(r"^=+\s*", "", l) for l in lines
                   if re.search(r"ERROR SUMMARY: \d+ error|RACECHECK SUMMARY: \d+ hazard", l)]
        reports = [l for l in lines if l.startswith("=") and "COMPUTE-SANITIZER" not in l
                   and not re.search(r"SUMMARY:", l)]
        runs.append({"step": name, "tool": m.group(1), "program": m.group(2), "status": s["status"],
                     "seconds": s["seconds"], "summary": summary[-1] if summary else None, "note": s["note"],
                     "command": lines[0][2:] if lines and lines[0].startswith("$ ") else None,
                     "reports": trim(reports, 30, 0) if s["status"] == "failed" else []})
    return runs

def custom_layer():
    s = steps.get("custom_layer")
    if not s:
        return None
    lines = log_text("custom_layer", 100000) or []
    return {"status": s["status"], "note": s["note"],
            "summary": [l for l in lines if re.search(r"tests passed|tests failed|No tests were found", l)],
            "tests": [l.strip() for l in lines if RESULT.match(l)],
            "tail": lines[-15:] if s["status"] == "failed" else []}

def display_dir():
    """REPORT_DIR as the command to run next names it: relative to the repository if inside."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    d = os.path.abspath(rdir)
    return os.path.relpath(d, repo) if d.startswith(repo + os.sep) else d

def only_list(names):
    """NAMES as --only takes them, shortest: every sanitizer run gpu_check.sh knows (info.txt's
    sanitize_runs) -> sanitize, every run of one tool -> the tool."""
    known = [r.replace(":", "_", 1) for r in info.get("sanitize_runs", "").split()]
    known = ["sanitize_" + r for r in known]
    chosen = set(names)
    for group, members in GROUPS.items():
        if all(m in chosen for m in members):
            names = [n for n in names if n not in members] + [group]
    if known and all(r in chosen for r in known):
        names = [n for n in names if n not in known] + ["sanitize"]
    else:
        for tool in TOOLS:
            runs = [r for r in known if r.startswith(f"sanitize_{tool}_")]
            if runs and all(r in chosen for r in runs):
                names = [n for n in names if n not in runs] + [tool]
    return ",".join(names)

def not_run():
    """The steps not run or not finished, why, and the commands that run them next."""
    rows, for_time, for_tool, partial = [], [], [], False
    for name, s in steps.items():
        if s["status"] not in ("skipped", "partial", "missing"):
            continue
        rows.append({"step": name, "status": s["status"], "why": s["note"]})
        if s["status"] in ("skipped", "partial"):
            rerun = {"configure": "build", "prerequisites": None, "compute_sanitizer": None}.get(name, name)
            if rerun and rerun not in for_time:
                for_time.append(rerun)
            partial = partial or (s["status"] == "partial" and bool(SANITIZE.match(name)))
        elif SANITIZE.match(name) and (s["note"] or "").startswith("compute-sanitizer"):
            for_tool.append(name)
    if len(for_time) > 1 and "build" in for_time:  # the build runs first anyway
        for_time.remove("build")
    commands = []
    if for_time:
        commands.append({"why": "To run the steps skipped or cut for lack of time (same report directory: the "
                                "report then merges both runs):",
                         "command": f"tools/gpu_check.sh {display_dir()} --only {only_list(for_time)}"
                                    + (" --sanitize-timeout 480" if partial else "")})
    if for_tool:
        commands.append({"why": "To run the sanitizer runs that found no working compute-sanitizer, once it works "
                                "on the machine:",
                         "command": f"tools/gpu_check.sh {display_dir()} --only {only_list(for_tool)}"})
    return rows, commands

def bench(step):
    lines = log_text(step)
    if lines is None:
        return None
    return {"command": lines[0][2:] if lines and lines[0].startswith("$ ") else None,
            "output": lines[1:] if lines and lines[0].startswith("$ ") else lines,
            "gflops_lines": [l for l in lines if "GFLOP" in l],
            "json": load(step + ".json")}

def gemm_ratio(steps_, key):
    """gemm_bench's ratio `key` (e.g. tc_bf16_over_vendor_bf16) from the steps' JSON, per size."""
    out = {}
    for step in steps_:
        j = load(step + ".json") or {}
        out.update({str(r["size"]): r[key] for r in j.get("hand_over_vendor", []) if key in r})
    return out or None

def mnist_graph():
    """mnist_train --recipe fast --cuda-graph --data-on-device: the seconds of training (the
    training loops, evaluation excluded) up to the end of the first epoch at >= 99.0% test
    accuracy."""
    j = load("mnist_graph.json")
    if not j:
        return None
    acc = j.get("test_accuracy_per_epoch") or []
    secs = j.get("train_seconds_per_epoch") or []
    reached = next((i for i, a in enumerate(acc) if a >= 0.99), None)
    out = {k: j.get(k) for k in ("recipe", "epochs", "batch_size", "precision", "device", "kernels",
                                 "test_accuracy", "train_seconds", "train_images_per_sec", "cuda_graph")
           if k in j}
    out.update(test_accuracy_per_epoch=acc, train_seconds_per_epoch=secs,
               epoch_reaching_99=None if reached is None else reached + 1,
               seconds_to_99=sum(secs[:reached + 1]) if reached is not None and len(secs) > reached else None)
    return out

def resnet_graph():
    """The resnet_graph_* steps' JSON (tools/bench_resnet_vs_pytorch.sh's KILN_BENCH_JSON), merged."""
    out = {"configs": [], "not_run": [], "failed": []}
    found = False
    for name in GROUPS["resnet_graph"]:
        j = load(name + ".json")
        if not j:
            continue
        found = True
        for k in out:
            out[k] += j.get(k, [])
    return out if found else None

# The Hopper steps on bf16 (gemm_bench's kernels), each with the step before it.
HOPPER_STEPS = {"sm90_bf16": "tc_bf16", "sm90ws_bf16": "sm90_bf16", "sm90p_bf16": "sm90ws_bf16"}
HOPPER_NAMES = {"sm90_bf16": "step 5, TMA and wgmma", "sm90ws_bf16": "step 6, warp-specialised",
                "sm90p_bf16": "step 7, persistent"}
gemm_ladder = gpu_report_gemm.ladder(load)
report = {
    "date": info.get("date"), "commit": info.get("commit"), "changed_files": info.get("changed_files"),
    "commit_source": info.get("commit_source"),
    "gpu": {k: info.get(k) for k in ("gpu", "driver", "gpu_memory", "compute_capability", "gpu_count")},
    "nvcc": info.get("nvcc"), "cmake": info.get("cmake"), "cxx": info.get("cxx"), "cpus": info.get("cpus"),
    "cuda_architectures": info.get("cuda_architectures"), "dependencies": info.get("dependencies"),
    "cudnn": info.get("cudnn"), "cublas": info.get("cublas"), "stages": info.get("stages"),
    "epochs": epochs, "steps": steps, "mnist": runs, "ratio_kiln_vendor_over_pytorch": ratio,
    "tests": {"gpu": ctest_summary("ctest_gpu"), "gpu_vendor": ctest_summary("ctest_gpu_vendor"),
              "cpu": ctest_summary("ctest_cpu")},
    "gemm": bench("gemm_bench"), "gemm_steps": bench("gemm_steps"),
    "gemm_steps_8192": bench("gemm_steps_8192"), "conv": bench("conv_bench"),
    "resnet": bench("resnet_gpu"),
    "resnet_graph": resnet_graph(), "mnist_graph": mnist_graph(),
    # Our tensor-core GEMM over cublasGemmEx on the same bf16 inputs, per size (aim >= 0.50).
    "tc_bf16_over_vendor_bf16": gemm_ratio(["gemm_steps", "gemm_steps_8192"], "tc_bf16_over_vendor_bf16"),
    # The Hopper steps 5-7 over cublasGemmEx and over the step before, bf16, per size 1024..8192.
    **{f"{k}_over_{ref}": gemm_ratio(["gemm_bench"], f"{k}_over_{ref}")
       for k, before in HOPPER_STEPS.items() for ref in ("vendor_bf16", before)},
    # Steps 1-7 against cuBLAS per size, and the targets of steps 5 and 7.
    "gemm_ladder": gemm_ladder, "gemm_targets": gpu_report_gemm.targets(gemm_ladder),
    "gpu_tests": info.get("gpu_tests"), "gpu_tests_without_program": info.get("gpu_tests_without_program"),
    "compute_sanitizer": info.get("compute_sanitizer"),
    "custom_layer": custom_layer(), "sanitizers": sanitizer_runs(),
}
report["not_run"], report["next_commands"] = not_run()
report["ok"] = bool(steps) and all(s["status"] in ("ok", "missing") for s in steps.values())
with open(os.path.join(rdir, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
    f.write("\n")

def fmt(v, spec):
    return "-" if v is None else format(v, spec)

md = ["# Kiln GPU check", ""]
md.append(f"{info.get('date')} · commit `{info.get('commit')}`"
          + (f" ({info.get('changed_files')} changed files)" if info.get("changed_files") not in (None, "0") else "")
          + (f" · {info.get('commit_source')}" if info.get("commit_source") not in (None, "git") else ""))
md.append("")
md.append(f"- GPU: {info.get('gpu')} · driver {info.get('driver', '-')} · {info.get('gpu_memory', '-')} · "
          f"compute capability {info.get('compute_capability', '-')}")
md.append(f"- {info.get('nvcc', 'nvcc ?')} · {info.get('cmake', '')} · {info.get('cxx', '')} · "
          f"CUDA architectures {info.get('cuda_architectures')} · {info.get('cpus')} CPUs")
md.append(f"- dependencies: {info.get('dependencies')} · cuDNN: {info.get('cudnn', '-')} · cuBLAS: {info.get('cublas', '-')}")
if info.get("gpu_tests") or info.get("compute_sanitizer"):
    md.append("- " + " · ".join(x for x in (
        f"gpu tests in this build: {info['gpu_tests']}" if info.get("gpu_tests") else "",
        f"without a built program: {info['gpu_tests_without_program']}" if info.get("gpu_tests_without_program") else "",
        f"compute-sanitizer {info['compute_sanitizer']}" if info.get("compute_sanitizer") else "") if x))
md += ["", "## Steps", "", "| step | status | seconds | log | note |", "| --- | --- | --- | --- | --- |"]
for name, s in steps.items():
    md.append(f"| {name} | {s['status']} | {s['seconds']} | {s['log'] or '-'} | {s['note'] or ''} |")
if report["not_run"]:
    md += ["", "## Not run, or not finished", "", "| step | status | why |", "| --- | --- | --- |"]
    md += [f"| {r['step']} | {r['status']} | {r['why'] or ''} |" for r in report["not_run"]]
    for c in report["next_commands"]:
        md += ["", c["why"], "", "```sh", c["command"], "```"]
md += ["", f"## MNIST: the MNIST CNN, {epochs} epochs, batch 128, Adadelta (mnist_train's defaults)", "",
       "Train images/s: median over epochs of the training loop (device synchronised). Epoch: "
       "training + evaluation, median over epochs.", "",
       "| run | test accuracy | train images/s | epoch seconds | accuracy per epoch |",
       "| --- | --- | --- | --- | --- |"]
for key in ("kiln_hand", "kiln_vendor", "pytorch"):
    e = runs[key]
    label = {"kiln_hand": "Kiln hand", "kiln_vendor": "Kiln vendor", "pytorch": "PyTorch"}[key]
    if not e:
        md.append(f"| {label} | (no result) | | | |")
        continue
    per = ", ".join(f"{100 * a:.2f}" for a in (e.get("test_accuracy_per_epoch") or []))
    md.append(f"| {e['label']} | {fmt(100 * e['test_accuracy'] if e.get('test_accuracy') is not None else None, '.2f')}% "
              f"| {fmt(e.get('train_images_per_sec'), '.0f')} | {fmt(e.get('median_epoch_seconds'), '.2f')} | {per} |")
md.append("")
if ratio:
    md.append(f"**Kiln vendor / PyTorch**: throughput ratio {fmt(ratio.get('images_per_sec'), '.3f')} "
              f"(target >= 1.0), epoch-time ratio {fmt(ratio.get('median_epoch_seconds'), '.3f')}.")
else:
    md.append("**Kiln vendor / PyTorch**: not available (one of the two runs has no result).")
if kv and kv.get("test_accuracy") is not None:
    md.append(f"Kiln vendor test accuracy after {epochs} epochs: {100 * kv['test_accuracy']:.2f}% (target >= 99.0%).")
if pt:
    pj = load("pytorch.json") or {}
    md.append(f"PyTorch settings: cuDNN TF32 {pj.get('cudnn_allow_tf32')}, matmul TF32 {pj.get('matmul_allow_tf32')}, "
              f"cudnn.benchmark {pj.get('cudnn_benchmark')}.")
mg = report["mnist_graph"]
md += ["", "## MNIST, the fast recipe with the training step as one CUDA graph, data on the GPU (mnist_graph)", ""]
if mg:
    per = ", ".join(f"{100 * a:.2f}% in {s:.1f} s" for a, s in zip(mg["test_accuracy_per_epoch"], mg["train_seconds_per_epoch"]))
    if mg["seconds_to_99"] is not None:
        md.append(f"**{mg['seconds_to_99']:.1f} s of training to 99.0%** (reached after epoch {mg['epoch_reaching_99']}; "
                  "training loops only, evaluation excluded).")
    else:
        md.append("**99.0% not reached** in this run.")
    md.append(f"Epochs (test accuracy, training seconds): {per}. Final test accuracy "
              f"{fmt(100 * mg['test_accuracy'] if mg.get('test_accuracy') is not None else None, '.2f')}%, "
              f"{fmt(mg.get('train_images_per_sec'), '.0f')} train images/s (median epoch), "
              f"{mg.get('precision', '?')}, batch {mg.get('batch_size', '?')}.")
else:
    s = steps.get("mnist_graph")
    md.append(f"Not run: {s['note'] or s['status'] if s else 'no result in this report directory'}.")

rg = report["resnet_graph"]
md += ["", "## ResNet-50 training step as one CUDA graph: Kiln vs PyTorch eager and torch.compile (resnet_graph)", "",
       "Images/s, median of the rounds (tools/bench_resnet_vs_pytorch.sh). Kiln: train_step_bench eager and with "
       "`--cuda-graph`; PyTorch: eager NCHW and channels_last (cudnn.benchmark), and torch.compile(mode=\"reduce-overhead\") "
       "channels_last, its compilation and graph recording untimed. Ratios: Kiln graph over the best PyTorch eager "
       "setup, and over PyTorch compiled (> 1: Kiln faster).", ""]
if rg and rg["configs"]:
    md += ["| precision | image, batch | Kiln eager | Kiln graph | PyTorch eager | PyTorch eager NHWC | PyTorch compiled "
           "| graph / eager best | graph / compiled | Kiln launches/step eager, graph |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in rg["configs"]:
        ips, r, kl = c["images_per_sec"], c["ratios"], c.get("kiln_launches", {})
        launches = ", ".join(fmt(kl.get(w, {}).get("kernel_launches_per_step"), ".0f") for w in ("kiln", "kiln[graph]"))
        md.append(f"| {c['precision']} | {c['image']}x{c['image']}, {c['batch']} "
                  + "".join(f"| {fmt(ips.get(w), '.0f')} " for w in
                            ("kiln", "kiln[graph]", "pytorch[eager]", "pytorch[eager+nhwc]", "pytorch[compile+nhwc]"))
                  + f"| {fmt(r.get('kiln[graph] / pytorch eager best'), '.2f')} "
                  f"| {fmt(r.get('kiln[graph] / pytorch[compile+nhwc]'), '.2f')} | {launches} |")
if rg and (rg["not_run"] or rg["failed"]):
    md.append("")
for n in (rg or {}).get("not_run", []):
    md.append(f"- not run: {n}")
for n in (rg or {}).get("failed", []):
    md.append(f"- failed: {n}")
left = [f"{n}: {steps[n]['status']}" + (f" ({steps[n]['note']})" if steps[n]["note"] else "")
        for n in GROUPS["resnet_graph"] if n in steps and steps[n]["status"] != "ok"]
if left:
    md += [""] + [f"- {l}" for l in left]
if not rg and not left:
    md.append("Not run: no result in this report directory.")

for key, title in (("gpu", "ctest -L gpu"), ("gpu_vendor", "KILN_KERNELS=vendor ctest -L gpu (cuBLAS, cuDNN)"),
                   ("cpu", "CPU suite: ctest -LE 'gpu|sim'")):
    t = report["tests"][key]
    if t is None:
        continue
    md += ["", f"## Tests: {title}", ""]
    md += [f"    {l}" for l in t["summary"]] or ["    (no summary line: see the log)"]
    if t["failed_tests"]:
        md += ["", "Failed:", ""] + [f"    {l}" for l in t["failed_tests"][:40]]
    for f in t["failed_output"][:10]:
        md += ["", f"Output of {f['name']} ({f['reason']}):", "", "```"] + f["output"] + ["```"]
    if len(t["failed_output"]) > 10:
        md += ["", f"({len(t['failed_output']) - 10} more failed tests' output: logs/ and the JUnit file)"]
cl = report["custom_layer"]
if cl:
    md += ["", "## examples/custom_layer against this build installed (find_package(Kiln), a .cu file)", "",
           f"Status: {cl['status']}" + (f" ({cl['note']})" if cl["note"] else "") + ".", ""]
    md += [f"    {l}" for l in cl["tests"] + cl["summary"]]
    if cl["tail"]:
        md += ["", "Its log's last lines:", "", "```"] + cl["tail"] + ["```"]
md += gpu_report_gemm.markdown(report["gemm_ladder"], report["gemm_targets"])
for key, title in (("gemm", "GEMM: hand vs cuBLAS (gemm_bench)"),
                   ("gemm_steps", "GEMM steps at 2048^3 and 4096^3: f32 steps, tensor cores (bf16, f16), cuBLAS SGEMM and bf16 GemmEx (gemm_bench)"),
                   ("gemm_steps_8192", "GEMM steps at 8192^3 (gemm_bench)"),
                   ("conv", "Convolution: hand vs cuDNN (conv_bench)"),
                   ("resnet", "ResNet-50 training, Kiln vs PyTorch, TF32 off and on (tools/bench_resnet_vs_pytorch.sh)")):
    b = report[key]
    md += ["", f"## {title}", ""]
    step = steps.get(key) or steps.get(key + "_bench") or steps.get(key + "_gpu")
    if b is None or (step and step["status"] == "missing"):
        md.append(f"Not run: {step['note'] if step else 'no result in this report directory'}.")
        continue
    if key == "gemm_steps" and report["tc_bf16_over_vendor_bf16"]:
        md += [f"**tc_bf16 / vendor_bf16** (our tensor-core GEMM over cublasGemmEx, same bf16 inputs), "
               f"N = {size}: {r:.2f} (aim >= 0.50)." for size, r in report["tc_bf16_over_vendor_bf16"].items()]
        md.append("")
    for k, before in HOPPER_STEPS.items():
        if key != "gemm" or not report[f"{k}_over_vendor_bf16"]:
            continue
        over_before = report[f"{k}_over_{before}"] or {}
        step_before = "step 4" if before == "tc_bf16" else HOPPER_NAMES[before].split(",")[0]
        md += [f"**{k} / vendor_bf16** ({HOPPER_NAMES[k]}, over cublasGemmEx, same bf16 "
               f"inputs), N = {size}: {r:.2f}"
               + (f" (over {step_before}: {over_before[size]:.2f})." if size in over_before else ".")
               for size, r in report[f"{k}_over_vendor_bf16"].items()]
        md.append("")
    md += ["```", f"$ {b['command']}"] + b["output"] + ["```"]
if report["sanitizers"]:
    md += ["", "## compute-sanitizer over gpu test programs (hand kernels)", "",
           "| tool | program | status | seconds | summary |", "| --- | --- | --- | --- | --- |"]
    for r in report["sanitizers"]:
        md.append(f"| {r['tool']} | {r['program']} | {r['status']} | {r['seconds']} | "
                  f"{(r['note'] if r['status'] != 'ok' else None) or r['summary'] or r['note'] or ''} |")
    for r in report["sanitizers"]:
        if r["reports"]:
            md += ["", f"{r['tool']} over {r['program']}: its first reports", "", "```"] + r["reports"] + ["```"]
with open(os.path.join(rdir, "report.md"), "w") as f:
    f.write("\n".join(md) + "\n")
