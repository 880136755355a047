"""tools/gpu_report_gemm.py: the GEMM ladder of tools/gpu_report.py: steps 1-7 of Kiln's GEMM
(engine/cuda/kernels/gemm.cu, gemm_tensor_core.cu, gemm_sm90*.cu) against cuBLAS per size, from
the JSON of apps/gemm_bench that tools/gpu_check.sh's steps gemm_bench, gemm_steps and
gemm_steps_8192 wrote, and the targets of the Hopper steps, met or not.

A row of gemm_bench's JSON is {size, kernel, dtype, ms, gflops, max_rel_error, ok}, or
{size, kernel, dtype, skipped: why} for a kernel the device could not run (a GPU other than
compute capability 9.0, a Hopper step not in that build). Older reports lack the rows of later
steps: their cells say "-", their targets "not measured".
"""

# Where the rows come from: for each size, the last of these steps whose JSON holds it, so that
# every ratio of a size compares kernels timed in one run of gemm_bench.
SOURCES = ["gemm_bench", "gemm_steps", "gemm_steps_8192"]

# The ladder: (step, kernel, what it is); cuBLAS last, the two references of the ratios.
LADDER = [
    ("1", "naive", "naive: one thread per element"),
    ("2", "tiled", "shared-memory tiles"),
    ("3", "regblock", "register-blocked"),
    ("4", "tc_bf16", "tensor cores, WMMA"),
    ("4", "tc_f16", "tensor cores, WMMA"),
    ("5", "sm90_bf16", "Hopper: TMA, mbarriers, wgmma"),
    ("5", "sm90_f16", "Hopper: TMA, mbarriers, wgmma"),
    ("6", "sm90ws_bf16", "warp-specialised"),
    ("6", "sm90ws_f16", "warp-specialised"),
    ("7", "sm90p_bf16", "persistent"),
    ("7", "sm90p_f16", "persistent"),
    ("cuBLAS", "vendor", "cuBLAS SGEMM"),
    ("cuBLAS", "vendor_bf16", "cublasGemmEx"),
]

# (kernel, step, size, the least GFLOP/s over cublasGemmEx on the same bf16 inputs).
TARGETS = [
    ("sm90_bf16", "5", 4096, 0.55),
    ("sm90p_bf16", "7", 4096, 0.8),
    ("sm90p_bf16", "7", 8192, 0.8),
]


def rows_by_size(load):
    """{size: (step, simulated, {kernel: row})}: each size's rows from the last SOURCES step
    holding it. LOAD(name) returns a JSON file of the report directory, or None."""
    out = {}
    for step in SOURCES:
        j = load(step + ".json") or {}
        sizes = {}
        for r in j.get("results", []):
            if isinstance(r, dict) and "size" in r and "kernel" in r:
                sizes.setdefault(int(r["size"]), {})[r["kernel"]] = r
        for size, rows in sizes.items():
            out[size] = (step, bool(j.get("simulated")), rows)
    return dict(sorted(out.items()))


def ratio(rows, x, y):
    gx, gy = (rows.get(k, {}).get("gflops") for k in (x, y))
    return gx / gy if gx and gy else None


def ladder(load):
    """{size: {"source": step, "rows": [...]}}, one row per ladder kernel the run had: its
    TFLOP/s, over cublasGemmEx bf16 and (f32 steps) over cuBLAS SGEMM, or why it was skipped."""
    out = {}
    for size, (source, simulated, rows) in rows_by_size(load).items():
        table = []
        for step, kernel, what in LADDER:
            r = rows.get(kernel)
            if r is None:
                continue
            f32 = r.get("dtype") == "f32"
            table.append({"step": step, "kernel": kernel, "what": what, "dtype": r.get("dtype"),
                          "tflops": r["gflops"] / 1e3 if r.get("gflops") is not None else None,
                          "over_vendor_bf16": ratio(rows, kernel, "vendor_bf16"),
                          "over_vendor": ratio(rows, kernel, "vendor") if f32 else None,
                          "ok": r.get("ok"), "skipped": r.get("skipped")})
        if table:
            out[str(size)] = {"source": source, "simulated": simulated, "rows": table}
    return out


def targets(lad):
    """Each target: its ratio where both kernels ran, and met / not met / not measured (why)."""
    out = []
    for kernel, step, size, least in TARGETS:
        t = {"kernel": kernel, "step": step, "size": size, "target": least, "ratio": None}
        rows = {r["kernel"]: r for r in lad.get(str(size), {}).get("rows", [])}
        mine = rows.get(kernel)
        if mine and mine["over_vendor_bf16"] is not None:
            t["ratio"] = mine["over_vendor_bf16"]
            t["status"] = "met" if t["ratio"] >= least else "not met"
        else:
            t["status"] = "not measured"
            if mine and mine["skipped"]:
                t["why"] = f"{kernel} skipped: {mine['skipped']}"
            elif not mine:
                t["why"] = f"no {kernel} row at {size}^3 in this report"
            else:
                t["why"] = f"no vendor_bf16 row at {size}^3 in this report"
        out.append(t)
    return out


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def markdown(lad, tgts):
    """The ladder's section of report.md: the targets, then one table per size."""
    md = ["", "## GEMM ladder: steps 1-7 against cuBLAS (gemm_steps, gemm_steps_8192)", "",
          "TFLOP/s of C (f32) = A B on N x N matrices (2 N^3 FLOPs a product), and the ratios to "
          "cuBLAS on the same device in the same run: to cublasGemmEx on the same bf16 inputs "
          "(for every row), and to cuBLAS SGEMM (for the f32 steps).", ""]
    if not lad:
        return md + ["Not run: no GEMM results in this report directory."]
    for t in tgts:
        line = (f"- step {t['step']} ({t['kernel']}) >= {t['target']:.2f} x cublasGemmEx bf16 at "
                f"{t['size']}^3: ")
        if t["status"] == "not measured":
            md.append(line + f"**not measured** ({t['why']})")
        else:
            md.append(line + f"{t['ratio']:.2f}, **{t['status']}**")
    for size, s in lad.items():
        sim = ", SIMULATED: the CUDA simulator's figures, nothing about a GPU" if s.get("simulated") else ""
        md += ["", f"N = {size} ({s['source']}{sim}):", "",
               "| step | kernel | inputs | TFLOP/s | / cublasGemmEx bf16 | / cuBLAS SGEMM |",
               "| --- | --- | --- | --- | --- | --- |"]
        for r in s["rows"]:
            name = f"{r['kernel']} ({r['what']})"
            if r["skipped"]:
                md.append(f"| {r['step']} | {name} | {r['dtype'] or '-'} | skipped: {r['skipped']} | | |")
                continue
            wrong = " WRONG" if r["ok"] is False else ""
            md.append(f"| {r['step']} | {name} | {r['dtype'] or '-'} | {fmt(r['tflops'], '.1f')}{wrong} "
                      f"| {fmt(r['over_vendor_bf16'], '.2f')} | {fmt(r['over_vendor'], '.2f')} |")
    return md
