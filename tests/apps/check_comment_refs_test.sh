#!/usr/bin/env bash
# check_comment_refs_test.sh: tools/check_comment_refs.py fails when it should. It runs on a small
# tree made here (not a git work tree, so every file of it is read), with one good and one broken
# reference of each kind: a path from the root, a pattern, {a,b} alternatives, a built program,
# FILE.EXT:NAME, FILE.EXT:LINE (past the end, and within it: a warning only), a name next to a
# path (NAME in PATH, `NAME` (PATH)), a Markdown link; in
# C++ // and /* */ comments, a Python comment and docstring, a shell comment, a CMake comment and
# Markdown. What is not a comment (string literals, code, here-documents) and what is made at run
# time (build trees, datasets/mnist) must not be reported. Each broken reference must be reported
# on its own line, with the file and line of the comment, and the exit code must be 1; with the
# broken references fixed, exit 0 and the summary. Then the usage errors: exit 2.
# Usage: tests/apps/check_comment_refs_test.sh SOURCE_DIR   (exit 77: no python3, skipped)
set -uo pipefail
root=${1:?usage: check_comment_refs_test.sh SOURCE_DIR}
python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || { echo "no $python: skipped"; exit 77; }
tree=$(mktemp -d "${TMPDIR:-/tmp}/kiln-comment-refs.XXXXXX")
trap 'rm -rf "$tree"' EXIT
failed=0
fail() { echo "FAIL: $*" >&2; failed=$((failed + 1)); }

# ---- the made-up tree ------------------------------------------------------------------------
mkdir -p "$tree/engine/cuda" "$tree/layers" "$tree/docs" "$tree/tools" "$tree/apps" \
         "$tree/build/engine"
printf 'x\n' >"$tree/build/engine/built_only.h"   # a build tree is not part of the sources
cat >"$tree/engine/cuda/gemm.cu" <<'EOF'
// gemm.cu: ten lines.
__global__ void sgemm_tiled_kernel() {}
//
//
//
//
//
//
//
//
EOF
cat >"$tree/layers/conv2d.h" <<'EOF'
// conv2d.h
EOF
cat >"$tree/layers/conv2d_cpu.cpp" <<'EOF'
// conv2d_cpu.cpp
EOF
cat >"$tree/apps/CMakeLists.txt" <<'EOF'
# The programs.
add_executable(mnist_train mnist_train.cpp)
EOF
cat >"$tree/engine/ops.h" <<'EOF'
// ops.h: good: engine/cuda/gemm.cu, layers/conv2d*, layers/conv2d{.h,_cpu.cpp}, apps/mnist_train,
// engine/cuda/, gemm.cu:sgemm_tiled_kernel, cuda/gemm.cu:sgemm_tiled_kernel, ./layers/conv2d.h.
// Not references: build/engine/gone.h, datasets/mnist/train-images-idx3-ubyte, docs/NAME.md.
// Broken: engine/gone.h
/* Broken: layers/pool*
   and layers/conv2d{.h,_gone.cpp} */
const char* not_a_comment = "engine/in_a_string.h";  // broken: apps/gone_train
// broken: gemm.cu:sgemm_gone_kernel and gone.cu:sgemm_tiled_kernel
// a line number: gemm.cu:3 (a warning), and past the end: gemm.cu:11
// good: sgemm_tiled_kernel in engine/cuda/gemm.cu; broken: sgemm_gone_kernel in
// engine/cuda/gemm.cu, `GoneClass` (layers/conv2d.h)
EOF
cat >"$tree/tools/run.py" <<'EOF'
"""run.py: good: tools/run.py. Broken: tools/gone.py."""
s = "tools/in_a_string.py"  # broken: tools/gone_too.py
EOF
cat >"$tree/tools/run.sh" <<'EOF'
#!/usr/bin/env bash
# run.sh: good: tools/run.sh. Broken: tools/gone.sh
echo "tools/in_a_string.sh"  # broken: engine/ops.h:gone_function
cat <<'END'
# a here-document's line: tools/in_a_heredoc.sh
END
EOF
cat >"$tree/CMakeLists.txt" <<'EOF'
# good: engine/ops.h; broken: engine/gone.cmake
set(x "# engine/in_a_string.cmake")
EOF
cat >"$tree/docs/guide.md" <<'EOF'
# Guide

Good: [ops](../engine/ops.h), [the readme](../README.md), [a site](https://example.com/x), [here](#guide).
Broken: [gone](../engine/gone_link.h), and docs/gone.md in the text.
EOF
printf '# Readme\n' >"$tree/README.md"

# ---- with the broken references ----------------------------------------------------------------
out=$("$python" "$root/tools/check_comment_refs.py" --root "$tree" 2>&1)
rc=$?
[[ $rc -eq 1 ]] || fail "broken references: exit $rc, want 1"
expect() { grep -qxF -- "$1" <<<"$out" || fail "the output lacks the line: $1"; }
expect "engine/ops.h:4: 'engine/gone.h' does not exist"
expect "engine/ops.h:5: 'layers/pool*' does not exist"
expect "engine/ops.h:6: 'layers/conv2d{.h,_gone.cpp}' does not exist"
expect "engine/ops.h:7: 'apps/gone_train' does not exist"
expect "engine/ops.h:8: 'gemm.cu' has no 'sgemm_gone_kernel'"
expect "engine/ops.h:8: 'gone.cu' does not exist"
expect "engine/ops.h:9: warning: 'gemm.cu:3' names a line number, which moves whenever the lines above it change: name the function instead"
expect "engine/ops.h:9: 'gemm.cu' has no line 11 (10 lines)"
expect "engine/ops.h:10: 'engine/cuda/gemm.cu' has no 'sgemm_gone_kernel'"
expect "engine/ops.h:11: 'layers/conv2d.h' has no 'GoneClass'"
expect "tools/run.py:1: 'tools/gone.py' does not exist"
expect "tools/run.py:2: 'tools/gone_too.py' does not exist"
expect "tools/run.sh:2: 'tools/gone.sh' does not exist"
expect "tools/run.sh:3: 'engine/ops.h' has no 'gone_function'"
expect "CMakeLists.txt:1: 'engine/gone.cmake' does not exist"
expect "docs/guide.md:4: '../engine/gone_link.h' does not exist"
expect "docs/guide.md:4: 'docs/gone.md' does not exist"
reported=$(grep -c -e "does not exist" -e "has no" <<<"$out")
[[ $reported -eq 16 ]] || fail "$reported broken references reported, want 16 (no more: strings, code, here-documents, build trees and run-time data are not references)"
[[ $out == *"in_a_"* || $out == *"build/"* || $out == *"datasets/"* || $out == *"NAME"* ]] &&
  fail "something that is not a reference was reported"
grep -qE "^check_comment_refs.py: [0-9]+ references checked in the comments and docs of 10 files: 16 broken, 2 line-number warnings$" <<<"$out" ||
  fail "no summary line of 16 broken references in 10 files"

# ---- fixed: every reference resolves -----------------------------------------------------------
sed -i -e 's/engine\/gone\.h/engine\/ops.h/; s/layers\/pool\*/layers\/conv*/; s/_gone\.cpp/_cpu.cpp/' \
       -e 's/apps\/gone_train/apps\/mnist_train/; s/sgemm_gone_kernel/sgemm_tiled_kernel/' \
       -e 's/gone\.cu:/gemm.cu:/; s/gemm\.cu:11/gemm.cu:10/; s/sgemm_gone_kernel in/sgemm_tiled_kernel in/' \
       -e 's/`GoneClass`/`conv2d`/' "$tree/engine/ops.h"
sed -i 's/gone\(_too\)\{0,1\}\.py/run.py/' "$tree/tools/run.py"
sed -i 's/gone\.sh/run.sh/; s/gone_function/ops/' "$tree/tools/run.sh"
sed -i 's/engine\/gone\.cmake/engine\/ops.h/' "$tree/CMakeLists.txt"
sed -i 's/gone_link\.h/ops.h/; s/docs\/gone\.md/docs\/guide.md/' "$tree/docs/guide.md"
out=$("$python" "$root/tools/check_comment_refs.py" --root "$tree" --quiet 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "every reference fixed: exit $rc, want 0; output: $out"
grep -qE "^check_comment_refs.py: [0-9]+ references checked in the comments and docs of 10 files: all resolve \(2 line-number warnings\)$" <<<"$out" ||
  fail "the summary of a clean tree is missing: $out"
[[ $out == *"warning:"* ]] && fail "--quiet printed a warning"

# ---- usage -------------------------------------------------------------------------------------
"$python" "$root/tools/check_comment_refs.py" --root "$tree/nowhere" >/dev/null 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "--root of a missing folder: exit $rc, want 2"
"$python" "$root/tools/check_comment_refs.py" --nonsense >/dev/null 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "an unknown option: exit $rc, want 2"

if ((failed)); then
  echo "$failed checks failed; the checker's output was:" >&2
  sed 's/^/    /' <<<"$out" >&2
  exit 1
fi
echo "check_comment_refs_test: all checks passed"
