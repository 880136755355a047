#!/usr/bin/env bash
# tools/train_mnist.sh: one command from a fresh machine to a trained MNIST model:
# installs dependencies, builds, fetches real MNIST, trains on the best device present.
# Arguments go to mnist_train (see build/apps/mnist_train --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/setup.sh"
KILN_BUILD_TARGET=mnist_train "$root/tools/build.sh"  # the app only: tests are tools/test.sh's job
"$root/datasets/fetch_mnist.sh"
exec "${KILN_BUILD_DIR:-$root/build}/apps/mnist_train" --device auto "$@"
