#!/usr/bin/python3
"""make_fixtures.py: golden fixtures from PyTorch for tests/layers/pytorch_parity_test.cpp.

Run with Debian's python3 (it has python3-torch 1.13; the first `python3` on PATH may not):

    /usr/bin/python3 tests/reference/make_fixtures.py        # rewrites tests/reference/fixtures/

Each case is one small file, tests/reference/fixtures/<case>.kfix, holding the inputs, the
parameters, the hyper-parameters (as i64/f64 records) and what PyTorch computed: outputs,
gradients, updated buffers. The files are committed; the C++ test never runs Python. Every
case seeds torch with its own fixed seed and PyTorch runs on one thread, so regenerating
gives the same bytes (same torch build) and adding a case does not change the others.

Gradients are those of a fixed random upstream gradient g (stored as "grad_out"): what
y.backward(g) puts into .grad, i.e. the gradient of sum(y * g). Losses are scalars and are
differentiated directly (upstream 1).

File format KILNFIX1 (all integers little-endian; also documented in tests/support/fixture.h):

    bytes 0..7   magic "KILNFIX1"
    u32          version (1)
    u32          number of records
    then, per record:
      u32        name length L, then L bytes of name (ASCII, unique within the file)
      u8         dtype: 0 f32, 1 f64, 2 i32, 3 i64, 4 u8   (the order of kiln::DType)
      u8         rank R (0..8)
      u16        reserved, 0
      i64 x R    shape
      u64        payload size in bytes (= numel * dtype size, checked by the reader)
      payload    raw little-endian elements, row-major (contiguous)

Keep fixtures tiny: the whole folder stays well under 200 KB.
"""
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

MAGIC = b"KILNFIX1"
VERSION = 1
DTYPE_CODES = {np.float32: 0, np.float64: 1, np.int32: 2, np.int64: 3, np.uint8: 4}
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def as_array(value):
    """A tensor, numpy array, Python int or float, as a contiguous little-endian array."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    elif isinstance(value, bool) or isinstance(value, int):
        value = np.array([int(value)], dtype=np.int64)
    elif isinstance(value, float):
        value = np.array([value], dtype=np.float64)
    arr = np.ascontiguousarray(value)
    if arr.dtype.type not in DTYPE_CODES:
        raise TypeError("unsupported dtype %s" % arr.dtype)
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


def write_fixture(case, records):
    """records: list of (name, value) in the order they are written."""
    names = [n for n, _ in records]
    if len(set(names)) != len(names):
        raise ValueError("%s: duplicate record names" % case)
    out = bytearray(MAGIC)
    out += struct.pack("<II", VERSION, len(records))
    for name, value in records:
        arr = as_array(value)
        raw = name.encode("ascii")
        out += struct.pack("<I", len(raw)) + raw
        out += struct.pack("<BBH", DTYPE_CODES[arr.dtype.type], arr.ndim, 0)
        out += struct.pack("<%dq" % arr.ndim, *arr.shape)
        data = arr.tobytes(order="C")
        out += struct.pack("<Q", len(data)) + data
    path = os.path.join(OUT_DIR, case + ".kfix")
    with open(path, "wb") as f:
        f.write(out)
    return len(out)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


# ---- Layers (f32, the dtype models train in) -------------------------------------------------

def linear_case(case, seed, n, fin, fout, bias=True):
    torch.manual_seed(seed)
    x = leaf(torch.randn(n, fin))
    w = leaf(torch.randn(fout, fin) / fin ** 0.5)
    b = leaf(torch.randn(fout)) if bias else None
    y = F.linear(x, w, b)
    g = torch.randn_like(y)
    y.backward(g)
    rec = [("x", x), ("weight", w)]
    if bias:
        rec.append(("bias", b))
    rec += [("y", y), ("grad_out", g), ("grad_x", x.grad), ("grad_weight", w.grad)]
    if bias:
        rec.append(("grad_bias", b.grad))
    return write_fixture(case, rec)


def leaky_relu_case(case, seed, x_shape, negative_slope):
    torch.manual_seed(seed)
    x = torch.randn(*x_shape)
    x[0].view(-1)[0] = 0.0  # one exact zero: backward takes the slope there
    x = leaf(x)
    y = F.leaky_relu(x, negative_slope)
    g = torch.randn_like(y)
    y.backward(g)
    return write_fixture(case, [("x", x), ("negative_slope", float(negative_slope)), ("y", y),
                                ("grad_out", g), ("grad_x", x.grad)])


def conv2d_case(case, seed, x_shape, w_shape, stride, padding, bias=True, dtype=torch.float32):
    torch.manual_seed(seed)
    fan_in = w_shape[1] * w_shape[2] * w_shape[3]
    x = leaf(torch.randn(*x_shape, dtype=dtype))
    w = leaf(torch.randn(*w_shape, dtype=dtype) / fan_in ** 0.5)
    b = leaf(torch.randn(w_shape[0], dtype=dtype)) if bias else None
    y = F.conv2d(x, w, b, stride=stride, padding=padding)
    g = torch.randn_like(y)
    y.backward(g)
    rec = [("stride", stride), ("padding", padding), ("x", x), ("weight", w)]
    if bias:
        rec.append(("bias", b))
    rec += [("y", y), ("grad_out", g), ("grad_x", x.grad), ("grad_weight", w.grad)]
    if bias:
        rec.append(("grad_bias", b.grad))
    return write_fixture(case, rec)


def max_pool2d_case(case, seed, x_shape, kernel, stride, padding):
    # randn values in f32: ties inside a window have probability ~0, so argmax is unambiguous.
    torch.manual_seed(seed)
    x = leaf(torch.randn(*x_shape))
    y, idx = F.max_pool2d(x, kernel, stride, padding, return_indices=True)
    g = torch.randn_like(y)
    y.backward(g)
    return write_fixture(case, [("kernel_size", kernel), ("stride", stride), ("padding", padding),
                                ("x", x), ("y", y), ("indices", idx), ("grad_out", g),
                                ("grad_x", x.grad)])


def avg_pool2d_case(case, seed, x_shape, kernel, stride, padding, count_include_pad):
    torch.manual_seed(seed)
    x = leaf(torch.randn(*x_shape))
    y = F.avg_pool2d(x, kernel, stride, padding, count_include_pad=count_include_pad)
    g = torch.randn_like(y)
    y.backward(g)
    return write_fixture(case, [("kernel_size", kernel), ("stride", stride), ("padding", padding),
                                ("count_include_pad", int(count_include_pad)), ("x", x), ("y", y),
                                ("grad_out", g), ("grad_x", x.grad)])


def batch_norm2d_case(case, seed, x_shape, training, momentum=0.1, eps=1e-5):
    """Through nn.BatchNorm2d, so the running-stat update is PyTorch's own."""
    torch.manual_seed(seed)
    c = x_shape[1]
    bn = torch.nn.BatchNorm2d(c, eps=eps, momentum=momentum)
    with torch.no_grad():
        bn.weight.copy_(1.0 + 0.5 * torch.randn(c))
        bn.bias.copy_(torch.randn(c))
        bn.running_mean.copy_(0.5 * torch.randn(c))
        bn.running_var.copy_(0.5 + torch.rand(c))
    # A per-channel offset and scale, so batch mean and var differ from 0 and 1.
    x = leaf(torch.randn(*x_shape) * (1.0 + torch.rand(1, c, 1, 1)) + torch.randn(1, c, 1, 1))
    rec = [("training", int(training)), ("momentum", float(momentum)), ("eps", float(eps)),
           ("x", x), ("weight", bn.weight), ("bias", bn.bias),
           ("running_mean_before", bn.running_mean.clone()),
           ("running_var_before", bn.running_var.clone())]
    bn.train(training)
    y = bn(x)
    g = torch.randn_like(y)
    y.backward(g)
    rec += [("y", y), ("grad_out", g), ("grad_x", x.grad), ("grad_weight", bn.weight.grad),
            ("grad_bias", bn.bias.grad), ("running_mean_after", bn.running_mean),
            ("running_var_after", bn.running_var),
            ("num_batches_tracked_after", bn.num_batches_tracked.reshape(1))]
    return write_fixture(case, rec)


def cross_entropy_case(case, seed, n, c, scale, dtype=torch.float32):
    torch.manual_seed(seed)
    logits = leaf(scale * torch.randn(n, c, dtype=dtype))
    targets = torch.randint(0, c, (n,), dtype=torch.int64)
    loss = F.cross_entropy(logits, targets)
    loss.backward()
    return write_fixture(case, [("logits", logits), ("targets", targets),
                                ("loss", loss.reshape(1)), ("grad_logits", logits.grad)])


# ---- Optimizers: two steps on two parameters with given gradients ----------------------------

def optimizer_case(case, seed, make_opt, dtype, hyper):
    torch.manual_seed(seed)
    shapes = [(3, 5), (7,)]
    params = [torch.randn(*s, dtype=dtype).requires_grad_(True) for s in shapes]
    rec = list(hyper)
    for i, p in enumerate(params):
        rec.append(("p%d_init" % i, p.detach().clone()))
    opt = make_opt(params)
    for step in (1, 2):
        for i, p in enumerate(params):
            grad = torch.randn_like(p)
            p.grad = grad
            rec.append(("p%d_grad%d" % (i, step), grad))
        opt.step()
        for i, p in enumerate(params):
            rec.append(("p%d_step%d" % (i, step), p.detach().clone()))
    return write_fixture(case, rec)


def sgd_case(case, seed, dtype, lr, momentum, dampening, weight_decay, nesterov):
    hyper = [("lr", float(lr)), ("momentum", float(momentum)), ("dampening", float(dampening)),
             ("weight_decay", float(weight_decay)), ("nesterov", int(nesterov))]
    return optimizer_case(case, seed, lambda ps: torch.optim.SGD(
        ps, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
        nesterov=nesterov), dtype, hyper)


def adam_case(case, seed, dtype, lr, betas, eps, weight_decay, decoupled):
    hyper = [("lr", float(lr)), ("beta1", float(betas[0])), ("beta2", float(betas[1])),
             ("eps", float(eps)), ("weight_decay", float(weight_decay)),
             ("decoupled", int(decoupled))]
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    return optimizer_case(case, seed, lambda ps: cls(
        ps, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), dtype, hyper)


def main():
    torch.set_num_threads(1)  # one thread: a reproducible summation order
    os.makedirs(OUT_DIR, exist_ok=True)
    sizes = {}
    f64 = torch.float64

    sizes["linear"] = linear_case("linear", 1, n=3, fin=7, fout=5)
    sizes["linear_batch1_nobias"] = linear_case("linear_batch1_nobias", 2, n=1, fin=11, fout=3,
                                                bias=False)

    sizes["leaky_relu"] = leaky_relu_case("leaky_relu", 3, (2, 3, 4, 5), 0.2)

    # Conv2d: (N, C, H, W), (K, C, R, S), stride, padding.
    sizes["conv2d_s1_p0"] = conv2d_case("conv2d_s1_p0", 10, (2, 3, 7, 6), (4, 3, 3, 3), 1, 0)
    sizes["conv2d_s2_p1"] = conv2d_case("conv2d_s2_p1", 11, (1, 2, 9, 8), (3, 2, 3, 3), 2, 1)
    sizes["conv2d_k1"] = conv2d_case("conv2d_k1", 12, (2, 5, 5, 3), (4, 5, 1, 1), 1, 0)
    sizes["conv2d_k1_s2"] = conv2d_case("conv2d_k1_s2", 13, (1, 3, 7, 5), (2, 3, 1, 1), 2, 0)
    sizes["conv2d_odd_s3_p2_nobias"] = conv2d_case("conv2d_odd_s3_p2_nobias", 14,
                                                   (3, 1, 11, 7), (2, 1, 5, 5), 3, 2, bias=False)
    sizes["conv2d_s2_p1_f64"] = conv2d_case("conv2d_s2_p1_f64", 15, (2, 3, 6, 7), (5, 3, 3, 3),
                                            2, 1, dtype=f64)

    # Pooling: (N, C, H, W), kernel, stride, padding.
    sizes["max_pool2d_k2"] = max_pool2d_case("max_pool2d_k2", 20, (2, 3, 6, 8), 2, 2, 0)
    sizes["max_pool2d_k3_s2_p1"] = max_pool2d_case("max_pool2d_k3_s2_p1", 21, (1, 2, 7, 9),
                                                   3, 2, 1)
    sizes["avg_pool2d_k2"] = avg_pool2d_case("avg_pool2d_k2", 22, (2, 3, 6, 8), 2, 2, 0, True)
    sizes["avg_pool2d_k3_s2_p1"] = avg_pool2d_case("avg_pool2d_k3_s2_p1", 23, (1, 2, 7, 9),
                                                   3, 2, 1, True)
    sizes["avg_pool2d_k3_s2_p1_exclude_pad"] = avg_pool2d_case(
        "avg_pool2d_k3_s2_p1_exclude_pad", 24, (1, 2, 7, 9), 3, 2, 1, False)

    sizes["batch_norm2d_train"] = batch_norm2d_case("batch_norm2d_train", 30, (4, 3, 5, 7), True)
    sizes["batch_norm2d_eval"] = batch_norm2d_case("batch_norm2d_eval", 31, (2, 3, 5, 7), False)

    sizes["cross_entropy"] = cross_entropy_case("cross_entropy", 40, n=5, c=7, scale=2.0)
    # Logits around +-60: exp() would overflow f32 without the max subtraction.
    sizes["cross_entropy_large"] = cross_entropy_case("cross_entropy_large", 41, n=3, c=4,
                                                      scale=60.0)
    sizes["cross_entropy_f64"] = cross_entropy_case("cross_entropy_f64", 42, n=4, c=6, scale=1.0,
                                                    dtype=f64)

    for dt, tag in ((torch.float32, "f32"), (f64, "f64")):
        sizes["sgd_momentum_" + tag] = sgd_case("sgd_momentum_" + tag, 50, dt, lr=0.1,
                                                momentum=0.9, dampening=0.1, weight_decay=0.01,
                                                nesterov=False)
        sizes["sgd_nesterov_" + tag] = sgd_case("sgd_nesterov_" + tag, 51, dt, lr=0.1,
                                                momentum=0.9, dampening=0.0, weight_decay=0.01,
                                                nesterov=True)
        sizes["adam_" + tag] = adam_case("adam_" + tag, 52, dt, lr=0.01, betas=(0.9, 0.999),
                                         eps=1e-8, weight_decay=0.01, decoupled=False)
        sizes["adamw_" + tag] = adam_case("adamw_" + tag, 53, dt, lr=0.01, betas=(0.8, 0.99),
                                          eps=1e-6, weight_decay=0.1, decoupled=True)

    total = sum(sizes.values())
    for name in sorted(sizes):
        print("%-36s %6d bytes" % (name + ".kfix", sizes[name]))
    print("%d fixtures, %d bytes in %s (torch %s)" % (len(sizes), total, OUT_DIR,
                                                      torch.__version__))
    if total > 200 * 1024:
        sys.exit("fixtures exceed 200 KB: shrink the cases")


if __name__ == "__main__":
    main()
