#!/usr/bin/python3
"""The PyTorch half of tools/bench_vs_pytorch.sh and tools/bench_resnet_vs_pytorch.sh: a training
step (forward, backward, SGD with momentum) or an inference forward, batch in memory, timed like
apps/train_step_bench.cpp (median of --steps after --warmup). Models: the MNIST CNN, or
torchvision's ResNets. Run with Debian's python3 (python3-torch, python3-torchvision). Prints one
line in the same format as train_step_bench.

--compile: torch.compile(mode="reduce-overhead"), PyTorch's CUDA-graph mode (Inductor's kernels,
recorded into CUDA graphs and replayed; "torch.compile",
https://pytorch.org/docs/stable/generated/torch.compile.html). PyTorch 2 only: with PyTorch 1.x
(the CPU machines' python3-torch 1.13) it says so and exits 2.

--serve: one process for many timed runs, so that a compiled model is compiled once and Kiln's
runs can alternate with PyTorch's (tools/bench_resnet_vs_pytorch.sh on cuda). Each line on stdin
is a request, flags that override the command line's (e.g. `--precision bf16 --channels-last
--compile --steps 20`); the answer is one line on stdout: the result line, or one starting with
"error:". A setup (model, shapes, precision, memory format, compiled or not) is built and warmed
up (--warmup steps) at its first request; a later request for it runs 2 untimed steps, then
--steps timed ones. The request `reset` drops every setup (and torch.compile's caches) and answers
`reset`. Messages of PyTorch and its compiler go to stderr. End of input ends the process.
"""
import argparse
import gc
import importlib.util
import os
import shlex
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

# Untimed steps before each later timed block of a --serve setup: the GPU back to speed after
# the other programs' runs, as Kiln's runs warm up each time.
REWARM_STEPS = 2
# reduce-overhead (CUDA Graph Trees) runs each compiled function eagerly once (the first call
# also compiles it), records it into a CUDA graph at the second call and replays it from the
# third: the forward and the backward each ("CUDAGraph Trees",
# https://pytorch.org/docs/stable/torch.compiler_cudagraph_trees.html). 3 steps are the least;
# the default warms up 10 so that cuDNN's benchmark and the allocator have settled too.
COMPILE_MIN_WARMUP = 3
COMPILE_WARMUP = 10


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


def make_parser():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mnist_cnn")
    ap.add_argument("--mode", choices=["train", "eval"], default="train")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--channels-last", action="store_true",
                    help="NHWC memory format (torch.channels_last) for model and input")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile(mode='reduce-overhead'): the forward and loss (and so the "
                    "backward) compiled by Inductor and replayed as CUDA graphs; PyTorch 2")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--tf32", action="store_true",
                    help="the same as --precision tf32 (train_step_bench's old spelling)")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16"], default="fp32",
                    help="tf32: CUDA TF32 tensor-core math in cuBLAS and cuDNN; bf16 / fp16: "
                    "torch.autocast around the forward (fp16 with a GradScaler)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=None,
                    help=f"untimed steps first (default 5; {COMPILE_WARMUP} with --compile, which "
                    f"needs at least {COMPILE_MIN_WARMUP}: compile and run, record, replay)")
    ap.add_argument("--serve", action="store_true",
                    help="answer requests read from stdin, one a line (see the module's docstring)")
    return ap


class UsageError(Exception):
    """A request this PyTorch or these flags cannot run (exit 2 when run once)."""


def check_flags(a):
    a.tf32 = a.tf32 or a.precision == "tf32"
    if a.warmup is None:
        a.warmup = COMPILE_WARMUP if a.compile else 5
    if a.steps < 1 or a.warmup < 0 or a.batch_size < 1 or a.threads < 1:
        raise UsageError("--steps, --batch-size and --threads must be >= 1, --warmup >= 0")
    if not a.compile:
        return
    if not hasattr(torch, "compile"):
        raise UsageError(f"--compile needs torch.compile (PyTorch 2.0 or later); this is PyTorch "
                         f"{torch.__version__} ({sys.executable}): run without --compile, or with "
                         f"a PyTorch 2 Python")
    if a.warmup < COMPILE_MIN_WARMUP:
        raise UsageError(f"--compile needs --warmup >= {COMPILE_MIN_WARMUP} (compile and run "
                         f"eagerly, record the CUDA graphs, replay them), got {a.warmup}")
    if a.device.startswith("cuda") and importlib.util.find_spec("triton") is None:
        raise UsageError("--compile on cuda needs Triton (Inductor writes its GPU kernels in "
                         "Triton), which this Python lacks: install PyTorch's triton package")


def cudagraph_skips():
    """Graphs torch.compile left out of CUDA graphs so far (Inductor counts them and logs why)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["inductor"]["cudagraph_skips"])
    except Exception:  # an older or newer PyTorch without the counter
        return 0


class Setup:
    """A model, its batch, optimizer and step function, for one set of flags."""

    def __init__(self, a):
        self.a = a
        torch.set_num_threads(a.threads)
        torch.manual_seed(1)
        if a.model == "mnist_cnn":
            net, classes, shape = SeedCNN(), 10, (a.batch_size, 1, 28, 28)
        else:
            import torchvision
            net = getattr(torchvision.models, a.model)(num_classes=1000)
            classes, shape = 1000, (a.batch_size, 3, a.image_size, a.image_size)
        self.shape = shape
        self.train = a.mode == "train"
        net.train(self.train)
        self.dev = dev = torch.device(a.device)
        self.cuda = dev.type == "cuda"
        self.activate()
        net = net.to(dev)
        x = (torch.rand(*shape) * 2 - 1).to(dev)
        if a.channels_last:
            net = net.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        self.net, self.x = net, x
        self.y = (torch.arange(a.batch_size) % classes).to(dev)
        self.opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        self.low = low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
        self.scaler = None
        if a.precision == "fp16" and self.cuda:
            amp = getattr(torch, "amp", None)
            self.scaler = (amp.GradScaler("cuda") if amp is not None and hasattr(amp, "GradScaler")
                           else torch.cuda.amp.GradScaler())

        # The loss of a batch (train) or the logits (eval), under autocast for bf16 / fp16. With
        # --compile this function is what torch.compile compiles: forward and loss in one graph,
        # and AOTAutograd derives the backward graph from it, so loss.backward() runs compiled
        # code too; both are recorded as CUDA graphs. The SGD step stays eager (torch.optim's
        # multi-tensor "foreach" kernels, a few launches for all the parameters), as does the
        # GradScaler's unscale and inf check: compiling the optimizer as well ("Compiling the
        # optimizer with torch.compile", https://pytorch.org/tutorials/recipes/compiling_optimizer.html)
        # costs another compilation per configuration for a few launches per step.
        train = self.train

        def forward(x, y):
            if low is None:
                out = net(x)
            else:
                with torch.autocast(dev.type, dtype=low):
                    out = net(x)
            return F.cross_entropy(out, y) if train else out

        self.forward = forward
        if a.compile:
            # dynamic=False: every setup's shapes are its own, compiled for them exactly.
            self.forward = torch.compile(forward, mode="reduce-overhead", dynamic=False)
        self.mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def activate(self):
        """The global settings of this setup (another setup of a --serve process may differ)."""
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = self.a.tf32
            torch.backends.cudnn.allow_tf32 = self.a.tf32
            torch.backends.cudnn.benchmark = True
        torch.set_num_threads(self.a.threads)

    def step(self):
        if self.a.compile and self.mark_step is not None:
            self.mark_step()  # a new iteration: the previous step's graph outputs are dead
        if self.train:
            self.opt.zero_grad()
            loss = self.forward(self.x, self.y)
            if self.scaler:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                loss.backward()
                self.opt.step()
        else:
            with torch.no_grad():
                self.forward(self.x, self.y)
        if self.cuda:
            torch.cuda.synchronize(self.dev)  # a step ends when the GPU has finished it

    def run(self, warmup, steps):
        """Median milliseconds of `steps` timed steps after `warmup` untimed ones."""
        self.activate()
        for _ in range(warmup):
            self.step()
        ms = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.step()
            ms.append((time.perf_counter() - t0) * 1000)
        ms.sort()
        return ms[len(ms) // 2]

    def line(self, med):
        a = self.a
        fmt = ("+nhwc" if a.channels_last else "") + ("+compile" if a.compile else "") + (
            "+tf32" if a.tf32 else "") + ("+" + a.precision if self.low is not None else "")
        return (f"pytorch model={a.model} mode={a.mode}{fmt} device={a.device} threads={a.threads} "
                f"torch={torch.__version__} "
                f"batch={a.batch_size} image={self.shape[-1]} "
                f"images_per_sec={a.batch_size * 1000 / med:.1f} ms_per_step={med:.2f}")


def first_run(setup):
    """The setup's first timed block: its warm-up (with --compile: compilation and the CUDA
    graphs' recording, timed and said on stderr) and its --steps."""
    a = setup.a
    skips = cudagraph_skips()
    setup.activate()
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        setup.step()
    if a.compile:
        print(f"bench_pytorch_step.py: {a.warmup} warm-up steps (torch.compile's compilation, "
              f"CUDA graph recording) took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        skipped = cudagraph_skips() - skips
        if skipped and setup.cuda:
            print(f"bench_pytorch_step.py: warning: torch.compile ran {skipped} graph(s) without "
                  f"CUDA graphs (Inductor's log above says why): this run is compiled, not all "
                  f"graphed", file=sys.stderr)
    return setup.run(0, a.steps)


def reset_compiled():
    """Drops torch.compile's compiled code and the CUDA graphs' memory pools (PyTorch 2)."""
    if not hasattr(torch, "compile"):
        return
    torch._dynamo.reset()
    try:  # private: where the reduce-overhead graphs keep their memory
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
        reset_cudagraph_trees()
    except (ImportError, AttributeError):
        pass


def serve(ap, base_argv):
    # The answers go to the original stdout; everything else written to fd 1 from now on (by
    # PyTorch, its compiler's workers, Triton's builds) goes to stderr, so no stray line can be
    # taken for an answer.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    setups = {}
    for request in sys.stdin:
        words = shlex.split(request)
        if not words:
            continue
        if words == ["reset"]:
            setups.clear()
            gc.collect()
            reset_compiled()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            proto.write("reset\n")
            continue
        try:
            a = ap.parse_args(base_argv + words)
        except SystemExit:  # argparse said why on stderr
            proto.write("error: bad flags\n")
            continue
        key = None
        try:
            check_flags(a)
            key = tuple(sorted((k, v) for k, v in vars(a).items() if k not in ("steps", "warmup")))
            if key in setups:
                med = setups[key].run(REWARM_STEPS, a.steps)
            else:
                setups[key] = Setup(a)
                med = first_run(setups[key])
            proto.write(setups[key].line(med) + "\n")
        except Exception as e:
            if not isinstance(e, UsageError):
                traceback.print_exc()
            setups.pop(key, None)
            msg = (str(e).strip().splitlines() or [""])[0]
            proto.write(f"error: {type(e).__name__}: {msg}\n")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next program on the GPU gets the memory back


def main():
    ap = make_parser()
    argv = sys.argv[1:]
    a = ap.parse_args(argv)
    if a.serve:
        serve(ap, [w for w in argv if w != "--serve"])
        return 0
    try:
        check_flags(a)
    except UsageError as e:
        print(f"bench_pytorch_step.py: error: {e}", file=sys.stderr)
        return 2
    setup = Setup(a)
    print(setup.line(first_run(setup)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
