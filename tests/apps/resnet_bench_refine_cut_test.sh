#!/usr/bin/env bash
# resnet_bench_refine_cut_test.sh: resnet_bench --refine-cut on a tiny ResNet over cpu:0/cpu:1.
# The refinement line of each schedule is printed; the JSON holds every pipeline setup's cut
# (the first block of each stage), and each schedule's refinement: the cuts timed, the start
# (the time-balanced cut) among them, the chosen cut the fastest unless within 1% of the start,
# each cut the start's neighbour (2 pieces: one boundary moved one block). --no-refine-cut and
# --balance params refine nothing; --refine-cut with --balance tutorial, with --no-refine-cut or
# with --dp is refused (exit 2) naming the flags.
# Usage: tests/apps/resnet_bench_refine_cut_test.sh RESNET_BENCH   (exit 77: no python3, skipped)
set -uo pipefail
bench=${1:?usage: resnet_bench_refine_cut_test.sh RESNET_BENCH}
python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || { echo "no $python: skipped"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-refine-cut.XXXXXX")
trap 'rm -rf "$dir"' EXIT
failed=0
fail() { echo "FAIL: $*" >&2; failed=$((failed + 1)); }
tiny=(--model resnet18 --width 8 --image-size 64 --batch-size 4 --classes 5 --steps 1
      --repeats 1 --devices cpu:0,cpu:1 --modes pipeline)

# ---- --refine-cut: the lines and the JSON ---------------------------------------------------
"$bench" "${tiny[@]}" --split-sizes 1,2 --schedule gpipe,zb-h2 --refine-cut \
  --json "$dir/r.json" >"$dir/r.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { fail "resnet_bench --refine-cut exited $rc"; cat "$dir/r.log" >&2; }
for s in gpipe zb-h2; do
  grep -Eq "^  $s split [12]: cut [a-z0-9.]+ (-> [a-z0-9.]+|kept, not moved) \([0-9.]+ -> [0-9.]+ s, [23] cuts timed\)$" "$dir/r.log" \
    || fail "no refinement line for $s"
done
grep -q "^--refine-cut took [0-9.]* s$" "$dir/r.log" || fail "no line with the refinement's cost"
"$python" - "$dir/r.json" <<'PY' || fail "the JSON of --refine-cut (above)"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["refine_cut"] is True, j["refine_cut"]
blocks = ["stem", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1",
          "layer4.0", "layer4.1", "head"]
for r in j["runs"]:
    cut = r["cut"]
    assert len(cut) == 2 and cut[0] == "stem" and cut[1] in blocks[1:], r
assert len(j["best_per_schedule"]) == 2
for b in j["best_per_schedule"]:
    rf = b["refinement"]
    tried = {tuple(t["cut"]): t["step_s"] for t in rf["tried"]}
    assert 2 <= len(tried) <= 3, rf
    start, chosen = tuple(rf["cut_balanced"]), tuple(rf["cut"])
    assert tried[start] == rf["step_s_balanced"] and tried[chosen] == rf["step_s"], rf
    assert b["cut"] == rf["cut"], (b["cut"], rf)  # the chosen cut is the one traced
    fastest = min(tried, key=tried.get)
    assert chosen == fastest or (chosen == start and tried[fastest] >= 0.99 * tried[start]), rf
    for t in tried:  # the start's neighbours: its boundary moved one block
        assert abs(blocks.index(t[1]) - blocks.index(start[1])) <= 1, (t, start)
PY

# ---- off: --no-refine-cut, and the default of --balance params ------------------------------
for flags in "--no-refine-cut" "--balance params"; do
  # shellcheck disable=SC2086
  "$bench" "${tiny[@]}" --split-sizes 2 --schedule gpipe $flags --json "$dir/off.json" \
    >"$dir/off.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { fail "resnet_bench $flags exited $rc"; cat "$dir/off.log" >&2; }
  grep -q "refine-cut" "$dir/off.log" && fail "$flags: a refinement was printed"
  "$python" -c "import json,sys; j=json.load(open(sys.argv[1])); \
assert j['refine_cut'] is False and 'refinement' not in j['best'] and j['runs'][0]['cut']" \
    "$dir/off.json" || fail "$flags: the JSON says a refinement ran, or has no cut"
done

# ---- refused ----------------------------------------------------------------------------------
refused() {  # refused EXPECTED_TEXT FLAGS...: exit 2 and a message with the text
  local want=$1; shift
  "$bench" "${tiny[@]}" "$@" >"$dir/bad.log" 2>&1
  local rc=$?
  [ "$rc" -eq 2 ] || fail "$*: exit $rc, expected 2"
  grep -q -- "$want" "$dir/bad.log" || { fail "$*: no \"$want\" in:"; cat "$dir/bad.log" >&2; }
}
refused "--balance tutorial" --split-sizes 2 --refine-cut --balance tutorial
refused "excludes" --split-sizes 2 --refine-cut --no-refine-cut
refused "--dp" --split-sizes 2 --refine-cut --dp 2

[ "$failed" -eq 0 ] && echo "resnet_bench --refine-cut: all checks passed"
exit $((failed > 0))
