#!/usr/bin/env python3
"""tools/gpu_report.py: the report of tools/gpu_check.sh (report.md and report.json) from the
steps it recorded in REPORT_DIR (steps.tsv, info.txt, logs/, the benchmarks' JSON files).

    tools/gpu_report.py REPORT_DIR EPOCHS

Any python3, standard library only (the GPU machine's own Python).
"""
import json, os, re, statistics, sys

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
order = ["prerequisites", "configure", "build", "ctest_gpu", "ctest_gpu_vendor", "ctest_cpu", "gemm_bench", "gemm_steps", "conv_bench",
         "mnist_vendor", "pytorch", "mnist_hand", "resnet_gpu", "mp_gpu", "mp_cpu"]
steps = dict(sorted(steps.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))

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
    return out

def bench(step):
    lines = log_text(step)
    if lines is None:
        return None
    return {"command": lines[0][2:] if lines and lines[0].startswith("$ ") else None,
            "output": lines[1:] if lines and lines[0].startswith("$ ") else lines,
            "gflops_lines": [l for l in lines if "GFLOP" in l],
            "json": load(step + ".json")}

def gemm_ratio(step, key):
    """gemm_bench's ratio `key` (e.g. tc_bf16_over_vendor_bf16) from the step's JSON, per size."""
    j = load(step + ".json") or {}
    return {str(r["size"]): r[key] for r in j.get("hand_over_vendor", []) if key in r} or None

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
    "gemm": bench("gemm_bench"), "gemm_steps": bench("gemm_steps"), "conv": bench("conv_bench"),
    "resnet": bench("resnet_gpu"),
    # Our tensor-core GEMM over cublasGemmEx on the same bf16 inputs, per size (aim >= 0.50).
    "tc_bf16_over_vendor_bf16": gemm_ratio("gemm_steps", "tc_bf16_over_vendor_bf16"),
}
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
md += ["", "## Steps", "", "| step | status | seconds | log | note |", "| --- | --- | --- | --- | --- |"]
for name, s in steps.items():
    md.append(f"| {name} | {s['status']} | {s['seconds']} | {s['log'] or '-'} | {s['note'] or ''} |")
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
for key, title in (("gpu", "ctest -L gpu"), ("gpu_vendor", "KILN_KERNELS=vendor ctest -L gpu (cuBLAS, cuDNN)"),
                   ("cpu", "CPU suite: ctest -LE 'gpu|sim'")):
    t = report["tests"][key]
    if t is None:
        continue
    md += ["", f"## Tests: {title}", ""]
    md += [f"    {l}" for l in t["summary"]] or ["    (no summary line: see the log)"]
    if t["failed_tests"]:
        md += ["", "Failed:", ""] + [f"    {l}" for l in t["failed_tests"][:40]]
for key, title in (("gemm", "GEMM: hand vs cuBLAS (gemm_bench)"),
                   ("gemm_steps", "GEMM steps at 4096^3: f32 steps, tensor cores (bf16, f16), cuBLAS SGEMM and bf16 GemmEx (gemm_bench)"),
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
    md += ["```", f"$ {b['command']}"] + b["output"] + ["```"]
with open(os.path.join(rdir, "report.md"), "w") as f:
    f.write("\n".join(md) + "\n")
