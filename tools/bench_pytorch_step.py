#!/usr/bin/python3
"""The PyTorch half of tools/bench_vs_pytorch.sh: a training step (forward, backward, SGD with
momentum) or an inference forward, batch in memory, timed like apps/train_step_bench.cpp
(median of --steps after --warmup). Models: the MNIST CNN, or torchvision's ResNets.
Run with Debian's python3 (python3-torch, python3-torchvision). Prints one line in the same
format as train_step_bench."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class SeedCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.dropout(F.max_pool2d(x, 2), 0.25, self.training)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(F.dropout(x, 0.5, self.training))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mnist_cnn")
    ap.add_argument("--mode", choices=["train", "eval"], default="train")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--channels-last", action="store_true",
                    help="NHWC memory format (torch.channels_last) for model and input")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--tf32", action="store_true",
                    help="the same as --precision tf32 (train_step_bench's old spelling)")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16"], default="fp32",
                    help="tf32: CUDA TF32 tensor-core math in cuBLAS and cuDNN; bf16 / fp16: "
                    "torch.autocast around the forward (fp16 with a GradScaler)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    a.tf32 = a.tf32 or a.precision == "tf32"
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    if a.model == "mnist_cnn":
        net, classes, shape = SeedCNN(), 10, (a.batch_size, 1, 28, 28)
    else:
        import torchvision
        net = getattr(torchvision.models, a.model)(num_classes=1000)
        classes, shape = 1000, (a.batch_size, 3, a.image_size, a.image_size)
    train = a.mode == "train"
    net.train(train)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
        torch.backends.cudnn.benchmark = True
    net = net.to(dev)
    x = (torch.rand(*shape) * 2 - 1).to(dev)
    if a.channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    y = (torch.arange(a.batch_size) % classes).to(dev)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    autocast = lambda: torch.autocast(dev.type, dtype=low, enabled=low is not None)
    scaler = torch.cuda.amp.GradScaler() if a.precision == "fp16" and cuda else None
    ms = []
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        if train:
            opt.zero_grad()
            with autocast():
                loss = F.cross_entropy(net(x), y)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
        else:
            with torch.no_grad(), autocast():
                net(x)
        if cuda:
            torch.cuda.synchronize(dev)  # a step ends when the GPU has finished it
        if s >= a.warmup:
            ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    med = ms[len(ms) // 2]
    fmt = ("+nhwc" if a.channels_last else "") + ("+tf32" if a.tf32 else "") + (
        "+" + a.precision if low is not None else "")
    print(f"pytorch model={a.model} mode={a.mode}{fmt} device={a.device} threads={a.threads} "
          f"torch={torch.__version__} "
          f"batch={a.batch_size} image={shape[-1]} "
          f"images_per_sec={a.batch_size * 1000 / med:.1f} ms_per_step={med:.2f}")


if __name__ == "__main__":
    main()
