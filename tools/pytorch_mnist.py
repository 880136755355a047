#!/usr/bin/env python3
"""pytorch_mnist.py: apps/mnist_train's default training, in PyTorch, for the comparison of
tools/gpu_check.sh (the ratio Kiln / PyTorch on the same GPU).

    python3 tools/pytorch_mnist.py --device cuda --epochs 3 --json out/pytorch.json
    /usr/bin/python3 tools/pytorch_mnist.py --device cpu --epochs 1 --limit-train 2000

The same recipe as mnist_train with every flag at its default: the MNIST CNN (models/mnist_cnn.h,
the model of tools/bench_pytorch_step.py), Adadelta lr 1.0 (rho 0.9, eps 1e-6), StepLR gamma 0.7
after every epoch, batch 128 over a seeded random permutation per epoch (the last batch smaller),
evaluation in batches of 250. The data is handled the way mnist_train handles it: the IDX files
are read directly (numpy, no torchvision), normalised as data/mnist.cpp does it (float32,
(pixel / 255 - 0.1307) / 0.3081), held in host memory, and each batch is gathered on the CPU and
copied to the device. The loss is read back every step (mnist_train does too, to check it).

Differences that remain: PyTorch's own initialisation and random streams (Kiln draws from
Philox), and PyTorch's defaults for its GPU kernels (cuDNN picks the algorithms; TF32 in
convolutions is on by default, recorded in the JSON: --no-tf32 turns it off).

Timing as in mnist_train: train_images_per_sec is the median over epochs of (training images /
seconds of the training loop), with the device synchronised before each clock read; epoch_seconds
adds the evaluation. The JSON uses mnist_train's key names.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pytorch_step import SeedCNN  # noqa: E402  (the MNIST CNN, shared with that benchmark)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN, STD = np.float32(0.1307), np.float32(0.3081)  # data/mnist.h kMean, kStd


def read_idx(path, magic, dims):
    """The payload of an IDX file as uint8, shaped by its header; strict like data/mnist.cpp."""
    if not os.path.isfile(path):
        sys.exit(f"pytorch_mnist.py: error: MNIST file {path} not found: run "
                 "datasets/fetch_mnist.sh (or tools/gpu_bundle.sh unpack), or pass --data")
    raw = np.fromfile(path, dtype=np.uint8)
    header = 4 + 4 * dims
    if raw.size < header or int.from_bytes(raw[:4].tobytes(), "big") != magic:
        sys.exit(f"pytorch_mnist.py: error: {path} is not an IDX file with magic {magic}: "
                 "run datasets/fetch_mnist.sh again")
    shape = [int.from_bytes(raw[4 + 4 * d:8 + 4 * d].tobytes(), "big") for d in range(dims)]
    if raw.size != header + int(np.prod(shape)):
        sys.exit(f"pytorch_mnist.py: error: {path} has {raw.size} bytes, its header announces "
                 f"{header + int(np.prod(shape))}: run datasets/fetch_mnist.sh again")
    return raw[header:].reshape(shape)


def load(data_dir, split, limit):
    """(images float32 (N, 1, 28, 28), labels int64 (N)) on the CPU, the first `limit` only."""
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"), 2051, 3)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"), 2049, 1)
    if images.shape[0] != labels.shape[0]:
        sys.exit(f"pytorch_mnist.py: error: {split}: {images.shape[0]} images but "
                 f"{labels.shape[0]} labels")
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    # The 256 values a pixel can take, each computed in float32 exactly as data/mnist.cpp does.
    table = (np.arange(256, dtype=np.float32) / np.float32(255.0) - MEAN) / STD
    x = torch.from_numpy(np.ascontiguousarray(table[images][:, None, :, :]))
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_epoch(model, opt, x_all, y_all, device, batch_size, seed, epoch):
    model.train()
    n = x_all.shape[0]
    # A seeded permutation per epoch, a pure function of (seed, epoch) like Kiln's RandomSampler.
    order = torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(n))
    loss_sum, seen = 0.0, 0
    sync(device)
    start = time.perf_counter()
    for i in range(0, n, batch_size):
        idx = order[i:i + batch_size]
        x = x_all[idx].to(device)  # gathered on the CPU, then copied, like mnist_train
        y = y_all[idx].to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
        if not np.isfinite(value):
            sys.exit(f"pytorch_mnist.py: error: training diverged (loss {value}) at epoch {epoch + 1}")
        loss_sum += value * idx.numel()
        seen += idx.numel()
    sync(device)
    seconds = time.perf_counter() - start
    return loss_sum / max(seen, 1), seconds, seen / seconds if seconds > 0 else 0.0


def evaluate(model, x_all, y_all, device, batch_size):
    model.eval()
    correct, loss_sum = 0, 0.0
    sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(0, x_all.shape[0], batch_size):
            x = x_all[i:i + batch_size].to(device)
            y = y_all[i:i + batch_size].to(device)
            logits = model(x)
            loss_sum += F.cross_entropy(logits, y).item() * y.numel()
            correct += int((logits.argmax(1) == y).sum().item())
    sync(device)
    n = max(x_all.shape[0], 1)
    return correct / n, loss_sum / n, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default: cuda)")
    ap.add_argument("--epochs", type=int, default=6, help="epochs (mnist_train's default: 6)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--eval-batch-size", type=int, default=250)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--gamma", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--data", default=os.path.join(ROOT, "datasets", "mnist"),
                    help="directory holding the four MNIST IDX files")
    ap.add_argument("--limit-train", type=int, help="train on the first N training images only")
    ap.add_argument("--limit-test", type=int, help="evaluate on the first N test images only")
    ap.add_argument("--no-tf32", action="store_true",
                    help="strict float32: no TF32 in cuDNN convolutions or matrix products")
    ap.add_argument("--json", help="write a JSON summary here (mnist_train's key names)")
    ap.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    a = ap.parse_args()
    for name in ("epochs", "batch_size", "eval_batch_size", "limit_train", "limit_test"):
        v = getattr(a, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        ap.error(f"--json {a.json}: its directory does not exist: create it first")

    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"pytorch_mnist.py: error: --device {a.device}: PyTorch {torch.__version__} sees no "
              "CUDA GPU here; use --device cpu", file=sys.stderr)
        return 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    torch.manual_seed(a.seed)
    model = SeedCNN().to(device)
    opt = torch.optim.Adadelta(model.parameters(), lr=a.lr, rho=0.9, eps=1e-6)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=a.gamma)
    x_train, y_train = load(a.data, "train", a.limit_train)
    x_test, y_test = load(a.data, "test", a.limit_test)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if not a.quiet:
        print(f"pytorch_mnist: cnn ({sum(p.numel() for p in model.parameters())} parameters) on "
              f"{device} ({device_name}), torch {torch.__version__}, adadelta lr {a.lr:g} "
              f"(x{a.gamma:g} per epoch), batch {a.batch_size}, {x_train.shape[0]} train / "
              f"{x_test.shape[0]} test images, seed {a.seed}", flush=True)

    acc, losses, ips, secs = [], [], [], []
    for epoch in range(a.epochs):
        loss, train_s, rate = train_epoch(model, opt, x_train, y_train, device, a.batch_size,
                                          a.seed, epoch)
        sched.step()
        test_acc, test_loss, eval_s = evaluate(model, x_test, y_test, device, a.eval_batch_size)
        acc.append(test_acc)
        losses.append(loss)
        ips.append(rate)
        secs.append(train_s + eval_s)
        if not a.quiet:
            print(f"epoch {epoch + 1:2d}/{a.epochs}  train loss {loss:.4f}  test loss {test_loss:.4f}"
                  f"  test acc {100 * test_acc:.2f}%  {rate:.0f} img/s  {train_s + eval_s:.1f} s "
                  f"(train {train_s:.1f} s, eval {eval_s:.1f} s)", flush=True)

    summary = {
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "device": str(device),
        "device_name": device_name,
        "model": "cnn",
        "optimizer": "adadelta",
        "lr": a.lr,
        "gamma": a.gamma,
        "epochs": a.epochs,
        "batch_size": a.batch_size,
        "eval_batch_size": a.eval_batch_size,
        "threads": torch.get_num_threads(),
        "train_images": int(x_train.shape[0]),
        "test_images": int(x_test.shape[0]),
        "test_accuracy": acc[-1],
        "test_accuracy_per_epoch": acc,
        "train_loss_per_epoch": losses,
        "train_images_per_sec": statistics.median(ips),
        "train_images_per_sec_per_epoch": ips,
        "epoch_seconds": secs,
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "seed": a.seed,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    if not a.quiet:
        print(f"test accuracy {100 * acc[-1]:.2f}% after {a.epochs} epochs; median "
              f"{statistics.median(ips):.0f} img/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
