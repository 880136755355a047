#!/usr/bin/env bash
# kill_resume.sh: is mnist_train crash consistent? Kills a training run with SIGKILL at random
# moments, resumes it from its newest checkpoint each time, and checks that every checkpoint a
# kill leaves behind, and the final weights, are bit for bit those of an uninterrupted run.
#
#   tools/kill_resume.sh [KILLS]        KILLS: SIGKILLs to deliver (default 20)
#
# Environment:
#   KILN_BUILD_DIR       build tree holding apps/mnist_train and apps/checkpoint_tool
#                        (default: build-cpu, else build, under the source tree)
#   KILN_MNIST_TRAIN, KILN_CHECKPOINT_TOOL   the two programs themselves (default: in the tree)
#   KILN_SOURCE_DIR      source tree (default: this script's parent); MNIST in datasets/mnist
#   KILL_RESUME_DIST     --dist of the run, e.g. local:2 (default: none)
#   KILL_RESUME_LIMIT    training images (default 1000: 2 epochs of 32 steps at batch 32)
#   KILL_RESUME_EVERY    --checkpoint-every (default 2)
#   KILL_RESUME_SEED     seed of the kill moments (default: random; printed, to replay a run)
#   KILL_RESUME_DIR      scratch directory (default: a fresh mktemp -d, removed on success)
#
# How (one training run, cut KILLS times):
#  1. The uninterrupted reference run, with the same flags. Every checkpoint it writes is copied
#     aside as ref/<epoch>-<position>.ckpt (a rename replaces the file whole, so a copy is
#     always of a complete file).
#  2. KILLS times: start (or --resume) the run, wait a random moment, SIGKILL it. Two kills in
#     three wait until the checkpoint has been replaced 0 or 1 times (1 while there is none), then
#     sleep a random part of a checkpoint interval (so a kill may also come before the resumed
#     run got anywhere); every third one sets KILN_CHECKPOINT_TEST_STALL_MS (the writer
#     sleeps with the .tmp half written, engine/serialize.h) and kills while the .tmp exists:
#     a crash in the middle of a checkpoint write. After each kill the checkpoint on disk must
#     be complete and equal the reference's checkpoint at the same (epoch, position): the
#     kill counts as identical.
#  3. The last resume runs to the end; its final checkpoint must equal the reference's.
# Prints "kill-and-resume: K/N identical" (N kills, K of them identical; a kill whose place the
# reference's copies missed, or that left no checkpoint, is "not compared") and the final
# verdict. Exit 0 when the final weights and every compared checkpoint matched and all KILLS
# were delivered; 1 on a mismatch; 2 on bad usage; 77 without MNIST (the
# ctest skip code).
set -euo pipefail

kills=${1:-20}
[[ $kills =~ ^[0-9]+$ ]] || { echo "kill_resume.sh: KILLS must be a number, got '$kills'" >&2; exit 2; }
src=${KILN_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
build=${KILN_BUILD_DIR:-}
if [[ -z $build ]]; then
  for b in "$src/build-cpu" "$src/build"; do [[ -x $b/apps/mnist_train ]] && { build=$b; break; }; done
fi
train=${KILN_MNIST_TRAIN:-$build/apps/mnist_train}
tool=${KILN_CHECKPOINT_TOOL:-$build/apps/checkpoint_tool}
for exe in "$train" "$tool"; do
  [[ -x $exe ]] || { echo "kill_resume.sh: $exe not found: build mnist_train and checkpoint_tool, or set KILN_BUILD_DIR" >&2; exit 2; }
done
data=$src/datasets/mnist
if [[ ! -f $data/train-images-idx3-ubyte ]]; then
  echo "kill_resume.sh: no MNIST in $data (run datasets/fetch_mnist.sh): skipped"
  exit 77
fi
seed=${KILL_RESUME_SEED:-$(( (RANDOM << 15) | RANDOM ))}
RANDOM=$seed
dir=${KILL_RESUME_DIR:-}
keep_dir=1
if [[ -z $dir ]]; then dir=$(mktemp -d); keep_dir=0; fi
mkdir -p "$dir/ref"
pid=""
cleanup() { if [[ -n $pid ]]; then kill -9 "$pid" 2>/dev/null || true; fi; }
trap cleanup EXIT

dist=${KILL_RESUME_DIST:-none}
threads=2
[[ $dist == local:* ]] && threads=1  # per rank: the ranks are threads of one process
args=(--data "$data" --limit-train "${KILL_RESUME_LIMIT:-1000}" --limit-test 200 --epochs 2
      --batch-size 32 --checkpoint-every "${KILL_RESUME_EVERY:-2}" --threads "$threads"
      --workers 1 --dist "$dist" --quiet)
ckpt=$dir/run.ckpt

now() { date +%s.%N; }
alive() { kill -0 "$1" 2>/dev/null; }
# The polling loops below use shell builtins only: on a busy machine, a fork every 10 ms (stat,
# sleep) would slow the very run being measured.
exec {nap_fd}<> <(:)
nap() { read -r -t 0.01 -u "$nap_fd" _ || true; }
# True once $1 is newer than the marker $2 (a rename put a new checkpoint there); then the
# marker takes its time.
replaced() {
  if [[ -f $1 && ( ! -f $2 || $1 -nt $2 ) ]]; then touch -r "$1" "$2"; return 0; fi
  return 1
}
# A random number of seconds in [0, $1), 3 decimals.
random_seconds() { awk -v r="$RANDOM" -v m="$1" 'BEGIN { printf "%.3f", r / 32768 * m }'; }
# The meta entries of checkpoints $1 and $2 (and their tensors' names and shapes) are equal,
# but for the epochs' seconds (history_seconds: timings, which a resumed run does not repeat).
same_meta() {
  cmp -s <("$tool" info "$1" | grep -v '^history_seconds=') \
         <("$tool" info "$2" | grep -v '^history_seconds=')
}
# The reference's name for a checkpoint: <epoch>-<position>.
place_of() { echo "$("$tool" get "$1" epoch)-$("$tool" get "$1" epoch_position)"; }

echo "kill_resume: $kills kills, seed $seed, dist $dist, in $dir"
echo "  mnist_train ${args[*]} --checkpoint $ckpt [--resume $ckpt]"

# ---- 1. The reference, every checkpoint copied aside. --------------------------------------
t0=$(now)
"$train" "${args[@]}" --checkpoint "$dir/ref.ckpt" > "$dir/ref.log" 2>&1 &
pid=$!
copies=0
while alive "$pid"; do
  # Only a copy here (milliseconds): naming it needs a full read, done after the run, so the
  # loop is back before the next checkpoint lands.
  if replaced "$dir/ref.ckpt" "$dir/ref.seen"; then
    cp "$dir/ref.ckpt" "$dir/ref/seq$copies.ckpt" 2>/dev/null && copies=$((copies + 1))
  fi
  nap
done
wait "$pid" || { echo "kill_resume: the reference run failed:"; cat "$dir/ref.log"; exit 1; }
pid=""
for ((i = 0; i < copies; ++i)); do
  p=$(place_of "$dir/ref/seq$i.ckpt") || { echo "kill_resume: a copy of the reference's checkpoint is damaged"; exit 1; }
  mv "$dir/ref/seq$i.ckpt" "$dir/ref/$p.ckpt"
done
ref_seconds=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
[[ -f $dir/ref/$(place_of "$dir/ref.ckpt").ckpt ]] || cp "$dir/ref.ckpt" "$dir/ref/$(place_of "$dir/ref.ckpt").ckpt"
# The mean time between two checkpoints of the reference.
interval=$(awk -v t="$ref_seconds" -v n="$copies" 'BEGIN { printf "%.3f", t / (n > 0 ? n : 1) }')
echo "reference: $ref_seconds s, $copies checkpoints seen (one every ${interval} s)"

# ---- 2. Kill, check, resume. ------------------------------------------------------------
identical=0
differ=0
unchecked=0
delivered=0
mid_write=0
finished=0
t1=$(now)
for ((k = 1; k <= kills; ++k)); do
  resume=()
  [[ -f $ckpt ]] && resume=(--resume "$ckpt")
  stall=$(( k % 3 == 0 ))
  if (( stall )); then
    rm -f "$ckpt.tmp"
    KILN_CHECKPOINT_TEST_STALL_MS=2000 "$train" "${args[@]}" --checkpoint "$ckpt" "${resume[@]}" \
      > "$dir/run.log" 2>&1 &
    pid=$!
    # No checkpoint yet: let the first one complete (it stalls too), then catch the next write.
    while alive "$pid" && [[ ! -f $ckpt ]]; do nap; done
    while alive "$pid" && [[ ! -f $ckpt.tmp ]]; do nap; done
    sleep "$(random_seconds 1)"  # somewhere inside the 2 s the writer sleeps
  else
    "$train" "${args[@]}" --checkpoint "$ckpt" "${resume[@]}" > "$dir/run.log" 2>&1 &
    pid=$!
    want=$(( RANDOM % 2 )) seen=0
    [[ -f $ckpt ]] && touch -r "$ckpt" "$dir/run.seen"
    [[ -f $ckpt ]] || { want=1; rm -f "$dir/run.seen"; }  # at least one checkpoint to check
    while alive "$pid" && (( seen < want )); do
      replaced "$ckpt" "$dir/run.seen" && seen=$((seen + 1))
      nap
    done
    sleep "$(random_seconds "$interval")"
  fi
  if ! alive "$pid"; then  # it finished (or failed) before this kill
    if wait "$pid"; then finished=1; pid=""; break; fi
    echo "kill_resume: the run failed after $delivered kills:"; cat "$dir/run.log"; exit 1
  fi
  (( stall )) && [[ -f $ckpt.tmp ]] && mid_write=$((mid_write + 1))
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
  delivered=$((delivered + 1))
  if [[ ! -f $ckpt ]]; then
    echo "kill $k: no checkpoint on disk after the kill (not compared)"
    unchecked=$((unchecked + 1))
    continue
  fi
  place=$(place_of "$ckpt") || { echo "kill $k: the checkpoint is damaged"; exit 1; }
  if [[ ! -f $dir/ref/$place.ckpt ]]; then
    echo "kill $k: at $place, which the reference's copies missed (not compared)"
    unchecked=$((unchecked + 1))
  elif "$tool" compare "$dir/ref/$place.ckpt" "$ckpt" >/dev/null 2> "$dir/compare.log" &&
       same_meta "$dir/ref/$place.ckpt" "$ckpt"; then
    identical=$((identical + 1))
  else
    echo "kill $k: the checkpoint at $place DIFFERS from the reference's:"; cat "$dir/compare.log"
    differ=$((differ + 1))
  fi
done

# ---- 3. The rest of the run, and the final weights. -------------------------------------
if (( !finished )); then
  resume=()
  [[ -f $ckpt ]] && resume=(--resume "$ckpt")
  if ! "$train" "${args[@]}" --checkpoint "$ckpt" "${resume[@]}" > "$dir/run.log" 2>&1; then
    # Killed after the last checkpoint but before exiting: nothing is left to train.
    grep -q "already holds" "$dir/run.log" || { echo "kill_resume: the last resume failed:"; cat "$dir/run.log"; exit 1; }
  fi
fi
kill_seconds=$(awk -v a="$t1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
final=no
"$tool" compare "$dir/ref.ckpt" "$ckpt" >/dev/null && same_meta "$dir/ref.ckpt" "$ckpt" && final=yes
echo "kills delivered: $delivered ($mid_write while a checkpoint was being written), killed run: $kill_seconds s in all"
echo "kill-and-resume: $identical/$delivered identical ($unchecked not compared, $differ different)"
echo "final weights identical to the uninterrupted run: $final"
if [[ $final == yes && $differ == 0 && $delivered == "$kills" ]]; then
  (( keep_dir )) || rm -rf "$dir"
  exit 0
fi
if (( delivered < kills )); then
  echo "kill_resume: the run ended after $delivered of $kills kills: use fewer kills or a larger KILL_RESUME_LIMIT"
fi
echo "kill_resume: FAILED (files kept in $dir)"
exit 1
