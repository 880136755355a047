#!/usr/bin/python3
"""make_resnet_fixtures.py: golden fixtures from torchvision for tests/models/resnet_test.cpp.

Run with Debian's python3 (it has python3-torch 1.13 and python3-torchvision 0.14; the first
`python3` on PATH may not):

    /usr/bin/python3 tests/reference/make_resnet_fixtures.py   # rewrites tests/reference/fixtures/resnet_*

The files are committed; the C++ test never runs Python. Every random draw follows a fixed
torch.manual_seed(n) and torch runs on one thread, so regenerating gives the same bytes with
the same torch build. The .kfix files are KILNFIX1 (the format is documented in
tests/reference/make_fixtures.py and tests/support/fixture.h; the writer is
make_fixtures.write_fixture). Losses are F.cross_entropy (mean over the batch); "train" means
model.train(), one forward on the input, loss.backward(); "eval" means model.eval() and one
more forward on the same input, which uses the running statistics that the train forward
updated.

Each case is well posed (well_posed() below): n in torch.manual_seed(n) is the first from a
fixed start for which (1) every ReLU input of the train forward is at least 2e-5 from 0 and
every max-pool window with a positive maximum has its two largest values at least 2e-5
apart, so rounding cannot flip a ReLU or a pooling choice between PyTorch and Kiln, and
(2) the same step in f64 agrees with the f32 one to 3e-6 (forward, running statistics) and
3e-5 (gradients) in the error measure of the C++ comparisons, so the problem does not amplify
rounding. Both fixtures record what was chosen: "manual_seed" (i64), "relu_margin",
"pool_margin", "f64_error_forward", "f64_error_grad" (f64).

resnet_keys.txt: torchvision's names and shapes
    One line per tensor, in torchvision's order: `<model> param|buffer <name> <dtype> <dims>`
    (named_parameters() order, then named_buffers() order; dtype f32 or i64; no dims for a 0-d
    tensor, i.e. BatchNorm's num_batches_tracked, which Kiln stores as [1]), for resnet18 and
    resnet50 at 1000 classes. Then for all five nets, `<model> count <parameters> <state_dict
    entries>`. Lines starting with '#' are comments.

resnet18_hashed.kfix: torchvision.models.resnet18(num_classes=10), weights from a formula
    Its 11.7M weights are too large to commit, so Python and C++ both fill every parameter
    from the same formula, exactly (to the last bit of every f32):
      splitmix64(x): z = x + 0x9E3779B97F4A7C15; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
                     z = (z ^ (z >> 27)) * 0x94D049BB133111EB; return z ^ (z >> 31)
                     (all mod 2^64; Steele, Lea, Flood, "Fast splittable pseudorandom number
                     generators", OOPSLA 2014)
      u(p, i)      = (splitmix64(p * 2^32 + i) >> 11) * 2^-52 - 1, in double: uniform in
                     [-1, 1), exact. p is the parameter's ordinal in named_parameters() order
                     (conv1.weight is 0), i the element's row-major index.
      value        = cast to f32 of, in double:
                       weights of 2 or more dims (conv, fc):  u / sqrt(fan_in),
                           fan_in = numel / size(0)
                       a 1-d parameter of a module whose weight has 2+ dims (fc.bias): the same
                           scale as that weight
                       other 1-d parameters (BatchNorm): weight 1 + u / 8, bias u / 8
                     (1/8 is a power of two, so no rounding depends on how the compiler
                     contracts the multiply-add). Buffers keep their defaults (mean 0, var 1).
    Records: for every parameter, "param_crc32.<name>" (i64 [1]): zlib.crc32 of its f32
    bytes, so C++ can check it built the same weights before comparing anything else.
    "x" (2, 3, 48, 48) f32 (not 32x32: there layer4 is 1x1 and its BatchNorms normalise 2
    values per channel, whose gradient is a cancellation: f32 and f64 PyTorch differ by 1e-2),
    "labels" (2) i64, "logits_train" (2, 10), "loss" [1], then per
    parameter: "grad_norm.<name>", "grad_sum.<name>" and "grad_absmax.<name>" (f64 [1]: L2
    norm, sum and largest magnitude of the gradient, computed in f64 from the f32 gradient)
    and "grad_sample.<name>" (f32 [n]): the gradient at flat indices floor(k * numel / n),
    k = 0..n-1, n = min(64, numel).
    Per BatchNorm: "running_mean.<module>", "running_var.<module>" (f32, full) after the
    train forward. Then "logits_eval" (2, 10).

resnet_bottleneck_small.kiln and resnet_bottleneck_small.kfix: a narrow Bottleneck ResNet
    torchvision's ResNet and Bottleneck classes, with a stem of 8 channels instead of 64
    (SmallResNet below), which is Kiln's ResNetConfig{block = Bottleneck, layers = {2, 1,
    1, 1}, num_classes = 5, width_per_group = 16, base_planes = 8}: stages of 8, 16, 32, 64
    planes, 3x3 widths 2, 4, 8, 16, outputs 32, 64, 128, 256 channels. (Not width_per_group
    8: its layer1 convolutions would have 1 channel, and a convolution from 1 channel into a
    train-mode BatchNorm has a gradient of 0 up to eps, since the BN cancels the weight's
    scale: a comparison of rounding noise.) layer1 has two blocks, so both shortcuts
    (downsample and identity) are covered. torchvision's random init, then
    BatchNorm weights, biases and running statistics perturbed and num_batches_tracked set to
    3, so loading every kind of tensor matters. The .kiln is that state_dict, written by
    tools/export_torchvision.py's writer (what kiln::load_torchvision_weights reads).
    The .kfix: "x" (3, 3, 40, 36): odd sizes (the stages see 10x9, 5x5, 3x3, 2x2),
    "labels" (3), "logits_train" (3, 5), "loss" [1], "grad.<name>" (the full gradient of every
    parameter), "state_after.<name>" (every buffer after the train forward: running stats and
    num_batches_tracked, the latter [1] i64), "logits_eval" (3, 5).
"""
import copy
import os
import sys
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.models.resnet import Bottleneck, ResNet

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))
from make_fixtures import OUT_DIR, write_fixture  # noqa: E402
import export_torchvision  # noqa: E402

MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
SAMPLES = 64


# ---- The weight formula ------------------------------------------------------------------

def splitmix64(x):
    """splitmix64's output function on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hashed_uniform(ordinal, numel):
    """u(p, i) for i = 0..numel-1, in double, uniform in [-1, 1)."""
    keys = (np.uint64(ordinal) << np.uint64(32)) + np.arange(numel, dtype=np.uint64)
    return (splitmix64(keys) >> np.uint64(11)).astype(np.float64) * 2.0 ** -52 - 1.0


def fill_hashed(model):
    """Fills every parameter of `model` from the formula of the module docstring."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for ordinal, (name, p) in enumerate(model.named_parameters()):
            u = hashed_uniform(ordinal, p.numel())
            owner = name.rsplit(".", 1)[0] + ".weight"
            scale_from = p if p.dim() >= 2 else params.get(owner)
            if scale_from is not None and scale_from.dim() >= 2:
                fan_in = scale_from.numel() // scale_from.shape[0]
                v = u / np.sqrt(np.float64(fan_in))
            elif name.endswith(".weight"):
                v = 1.0 + u / 8.0
            else:
                v = u / 8.0
            p.copy_(torch.from_numpy(v.astype(np.float32).reshape(tuple(p.shape))))


def sample_indices(numel):
    n = min(SAMPLES, numel)
    return [k * numel // n for k in range(n)]


# ---- The small Bottleneck net --------------------------------------------------------------

class SmallResNet(ResNet):
    """torchvision's ResNet with `base_planes` stem channels (torchvision fixes 64) and stages
    of base_planes * 1, 2, 4, 8 planes: the same modules under the same names, built by
    torchvision's own _make_layer and run by its own forward."""

    def __init__(self, block, layers, num_classes, base_planes, width_per_group):
        nn.Module.__init__(self)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = base_planes
        self.dilation = 1
        self.groups = 1
        self.base_width = width_per_group
        self.conv1 = nn.Conv2d(3, base_planes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_planes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, base_planes, layers[0])
        self.layer2 = self._make_layer(block, base_planes * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, base_planes * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, base_planes * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(base_planes * 8 * block.expansion, num_classes)
        # torchvision's initialisation (ResNet.__init__).
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)


# ---- A train step, and choosing well-posed problems -------------------------------------

def train_step(model, x, labels, dtype):
    """On a copy of `model` in `dtype`: a train-mode forward on x, the cross-entropy loss, its
    backward, then an eval-mode forward (with the running statistics just updated). Returns
    {"logits_train", "loss", "grads" {name: grad}, "buffers" {name: tensor}, "logits_eval"}."""
    model = copy.deepcopy(model).to(dtype).train()
    logits = model(x.to(dtype))
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    out = {"logits_train": logits.detach(), "loss": loss.detach().reshape(1),
           "grads": {n: p.grad.detach() for n, p in model.named_parameters()},
           "buffers": {n: b.detach().clone() for n, b in model.named_buffers()}}
    model.eval()
    with torch.no_grad():
        out["logits_eval"] = model(x.to(dtype))
    return out


def scaled_error(actual, expected):
    """max_i |a_i - e_i| / (|e_i| + max_j |e_j|): what tests/support/fixture.h close() bounds."""
    a, e = actual.double(), expected.double()
    return ((a - e).abs() / (e.abs() + e.abs().max())).max().item()


# ReLU and max pooling are not differentiable everywhere: a ReLU input within rounding of 0, or
# a pooling window whose two largest values are within rounding of each other, can go one way
# in PyTorch and the other way in Kiln, and the gradient upstream of it then differs by far
# more than rounding. So every case is chosen so that in the train forward each ReLU input is
# at least KINK_MARGIN from 0 and each pooling window with a positive maximum has its two
# largest values at least KINK_MARGIN apart. The values there are BatchNorm outputs (or sums of
# two) of unit scale, where f32 implementations differ by ~1e-7 (a flip was seen at 2e-7):
# 2e-5 leaves a margin of 100x.
KINK_MARGIN = 2e-5
# And each case must be well conditioned: the same step in f64 must agree with the f32 one to
# these errors (scaled_error) on every tensor the C++ test compares, a tenth of its tolerances
# (forward 3e-5, gradients 3e-4), so that any correct f32 implementation passes with room.
# (Rounding is amplified where a gradient is a cancellation, e.g. that of a BN weight whose
# channel the next train-mode BN nearly normalises away.)
MAX_F64_ERROR = {"forward": 3e-6, "grad": 3e-5}


def kink_margins(model, x):
    """(smallest |ReLU input|, smallest gap between the two largest values of a max-pool window
    whose maximum is positive) in a train-mode forward of a copy of `model` on x."""
    model = copy.deepcopy(model).train()  # the copy's running statistics move, not model's
    out = {"relu": float("inf"), "pool": float("inf")}

    def relu_hook(module, inputs):
        out["relu"] = min(out["relu"], inputs[0].detach().abs().min().item())

    def pool_hook(module, inputs):
        k, s, p = module.kernel_size, module.stride, module.padding
        t = F.pad(inputs[0].detach(), (p, p, p, p), value=float("-inf"))
        n, c = t.shape[:2]
        windows = F.unfold(t, k, stride=s).reshape(n, c, k * k, -1)
        top = windows.topk(2, dim=2).values
        gap = (top[:, :, 0] - top[:, :, 1])[top[:, :, 0] > 0]
        if gap.numel() > 0:
            out["pool"] = min(out["pool"], gap.min().item())

    for m in model.modules():
        if isinstance(m, nn.ReLU):
            m.register_forward_pre_hook(relu_hook)
        elif isinstance(m, nn.MaxPool2d):
            m.register_forward_pre_hook(pool_hook)
    with torch.no_grad():
        model(x)
    return out["relu"], out["pool"]


def f64_errors(f32, f64):
    """The largest scaled_error of the f32 step against the f64 one, forward and gradients."""
    forward = [scaled_error(f32[k], f64[k]) for k in ("logits_train", "loss", "logits_eval")]
    forward += [scaled_error(b, f64["buffers"][n]) for n, b in f32["buffers"].items()
                if b.is_floating_point()]
    grads = [scaled_error(g, f64["grads"][n]) for n, g in f32["grads"].items()]
    return max(forward), max(grads)


def well_posed(make, first, tries=200):
    """make(n) -> (model, x, labels) after torch.manual_seed(n); the first n = first, first + 1,
    ... whose case keeps KINK_MARGIN from every kink and meets MAX_F64_ERROR. Returns
    (model, x, labels, f32 step, records describing the choice)."""
    for n in range(first, first + tries):
        torch.manual_seed(n)
        model, x, labels = make()
        relu, pool = kink_margins(model, x)
        if relu < KINK_MARGIN or pool < KINK_MARGIN:
            continue
        f32 = train_step(model, x, labels, torch.float32)
        forward, grad = f64_errors(f32, train_step(model, x, labels, torch.float64))
        if forward <= MAX_F64_ERROR["forward"] and grad <= MAX_F64_ERROR["grad"]:
            return model, x, labels, f32, [
                ("manual_seed", n), ("relu_margin", relu), ("pool_margin", pool),
                ("f64_error_forward", forward), ("f64_error_grad", grad)]
    sys.exit("no case within %d tries is well posed: relax KINK_MARGIN or MAX_F64_ERROR"
             % tries)


# ---- Cases --------------------------------------------------------------------------------

def kind_name(t):
    return {torch.float32: "f32", torch.int64: "i64"}[t.dtype]


def keys_case():
    lines = ["# resnet_keys.txt: torchvision %s state_dict names and shapes, written by"
             % torchvision.__version__,
             "# tests/reference/make_resnet_fixtures.py (format in its docstring)."]
    for name in ("resnet18", "resnet50"):
        model = getattr(torchvision.models, name)(weights=None)
        for kind, named in (("param", model.named_parameters()),
                            ("buffer", model.named_buffers())):
            for key, t in named:
                lines.append(" ".join([name, kind, key, kind_name(t)] +
                                      [str(d) for d in t.shape]))
    for name in MODELS:
        model = getattr(torchvision.models, name)(weights=None)
        lines.append("%s count %d %d" % (name, sum(p.numel() for p in model.parameters()),
                                         len(model.state_dict())))
    data = ("\n".join(lines) + "\n").encode("ascii")
    with open(os.path.join(OUT_DIR, "resnet_keys.txt"), "wb") as f:
        f.write(data)
    return len(data)


def resnet18_case():
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    fill_hashed(model)
    rec = []
    for name, p in model.named_parameters():
        crc = zlib.crc32(p.detach().numpy().astype("<f4").tobytes())
        rec.append(("param_crc32." + name, np.array([crc], dtype=np.int64)))

    # 48x48, not 32x32: at 32x32 layer4 is 1x1, so with 2 images its BatchNorms normalise
    # over 2 values, x_hat = +-sqrt(var / (var + eps)), and the gradient through them is
    # (g1 - g2) * (1 - x_hat^2): a cancellation, after which f32 and f64 PyTorch disagree by
    # 1e-2 in the gradients. At 48x48 layer4 is 2x2 (8 values per channel).
    def make():
        return model, torch.randn(2, 3, 48, 48), torch.randint(0, 10, (2,))

    model, x, labels, step, chosen = well_posed(make, 1800)
    rec += chosen
    rec += [("x", x), ("labels", labels), ("logits_train", step["logits_train"]),
            ("loss", step["loss"])]
    for name, grad in step["grads"].items():
        g = grad.double()
        flat = grad.reshape(-1)
        rec += [("grad_norm." + name, g.norm().reshape(1)),
                ("grad_sum." + name, g.sum().reshape(1)),
                ("grad_absmax." + name, g.abs().max().reshape(1)),
                ("grad_sample." + name, flat[sample_indices(flat.numel())])]
    for name, m in model.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            rec += [("running_mean." + name, step["buffers"][name + ".running_mean"]),
                    ("running_var." + name, step["buffers"][name + ".running_var"])]
    rec.append(("logits_eval", step["logits_eval"]))
    return write_fixture("resnet18_hashed", rec)


def bottleneck_case():
    def make():
        model = SmallResNet(Bottleneck, [2, 1, 1, 1], num_classes=5, base_planes=8,
                            width_per_group=16)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    c = m.num_features
                    m.weight.copy_(1.0 + 0.2 * torch.randn(c))
                    m.bias.copy_(0.2 * torch.randn(c))
                    m.running_mean.copy_(0.2 * torch.randn(c))
                    m.running_var.copy_(0.5 + torch.rand(c))
                    m.num_batches_tracked.fill_(3)
        return model, torch.randn(3, 3, 40, 36), torch.randint(0, 5, (3,))

    model, x, labels, step, chosen = well_posed(make, 5000)
    state = export_torchvision.kiln_arrays(model.state_dict())
    meta = {"format": "torchvision", "model": "resnet_bottleneck_small", "num_classes": "5",
            "torchvision": torchvision.__version__}
    kiln_size = export_torchvision.write_checkpoint(
        os.path.join(OUT_DIR, "resnet_bottleneck_small.kiln"), state, meta)

    rec = chosen + [("x", x), ("labels", labels), ("logits_train", step["logits_train"]),
                    ("loss", step["loss"])]
    for name, grad in step["grads"].items():
        rec.append(("grad." + name, grad))
    for name, b in step["buffers"].items():
        rec.append(("state_after." + name, b.reshape(-1) if b.dim() == 0 else b))
    rec.append(("logits_eval", step["logits_eval"]))
    return kiln_size, write_fixture("resnet_bottleneck_small", rec)


def main():
    torch.set_num_threads(1)  # one thread: a reproducible summation order
    os.makedirs(OUT_DIR, exist_ok=True)
    sizes = {"resnet_keys.txt": keys_case(), "resnet18_hashed.kfix": resnet18_case()}
    sizes["resnet_bottleneck_small.kiln"], sizes["resnet_bottleneck_small.kfix"] = \
        bottleneck_case()
    for name in sorted(sizes):
        print("%-32s %7d bytes" % (name, sizes[name]))
    print("%d files, %d bytes in %s (torch %s, torchvision %s)"
          % (len(sizes), sum(sizes.values()), OUT_DIR, torch.__version__,
             torchvision.__version__))
    if sizes["resnet18_hashed.kfix"] > 300 * 1024:
        sys.exit("resnet18_hashed.kfix exceeds 300 KB: sample fewer elements")


if __name__ == "__main__":
    main()
