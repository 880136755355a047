#!/usr/bin/python3
"""export_torchvision.py: writes a torchvision ResNet's state_dict as a Kiln checkpoint.

Run with Debian's python3 (it has python3-torch and python3-torchvision; the first `python3`
on PATH may not):

    /usr/bin/python3 tools/export_torchvision.py --model resnet50 --weights resnet50.pth \\
        --out resnet50.kiln
    /usr/bin/python3 tools/export_torchvision.py --model resnet18 --num-classes 10 --seed 0 \\
        --out resnet18.kiln

--model       resnet18 | resnet34 | resnet50 | resnet101 | resnet152
--weights F   a state_dict saved with torch.save (e.g. a file of torchvision's model zoo,
              https://pytorch.org/vision/0.14/models.html, downloaded beforehand), or a whole
              pickled model; it must fit the architecture key for key and shape for shape
--seed S      instead of --weights: torchvision's own random initialisation after
              torch.manual_seed(S) (kaiming-normal convolutions, BN weight 1 and bias 0)
--num-classes the size of the final fc layer; default: fc.weight's rows in --weights, else 1000
--out F       the Kiln checkpoint to write (atomically: F.tmp, then renamed)

Using the result from C++ (models/resnet.h):

    auto model = kiln::make_resnet("resnet50", 1000);     // same name and class count
    kiln::load_torchvision_weights(*model, "resnet50.kiln");
    model->eval();

load_torchvision_weights() checks every key and shape and throws kiln::Error (Input) naming
the file and the first key that is missing, unexpected or mis-shaped.

The file is exactly what kiln::write_checkpoint (engine/serialize.cpp) writes for the same
tensors and meta entries, byte for byte. Layout (little-endian; offsets in bytes):

    header (40 bytes)
       0  char[8] magic "KILNCKPT"
       8  u32     format version (1)
      12  u32     number of meta entries
      16  u32     number of tensor records
      20  u32     CRC32 of the table
      24  u64     table length in bytes
      32  u32     reserved (0)
      36  u32     CRC32 of bytes 0..35
    table (at 40)
      per meta entry: u32 key length, key, u32 value length, value
      per record:     u32 name length, name, u8 dtype, u8 ndim, u16 reserved,
                      i64 dims[ndim], u64 payload offset, u64 payload length, u32 payload CRC32
    payloads: raw contiguous element bytes, each starting at a multiple of 64 (zero padding)

Meta entries and records are in byte order of their keys (C++ std::map order). dtype codes
follow kiln::DType: 0 f32, 1 f64, 2 i32, 3 i64, 4 u8 (and 5 f16, 6 bf16 in format version 2,
which this script never writes). CRC32 is IEEE 802.3 (zlib.crc32 equals
kiln::crc32). BatchNorm's num_batches_tracked, a 0-d i64 tensor in PyTorch, is written with
shape [1], as Kiln stores it. Meta entries: "format" ("torchvision"), "model",
"num_classes", "torchvision" (the version that built the model).

Exit status: 0 on success, 2 for bad usage or input (a missing file, a state_dict that does
not fit the model), with a message saying what is wrong.
"""
import argparse
import os
import struct
import sys
import zlib

import numpy as np

MAGIC = b"KILNCKPT"
VERSION = 1
HEADER_BYTES = 40
ALIGN = 64
DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.int32): 2,
               np.dtype(np.int64): 3, np.dtype(np.uint8): 4}
MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


class InputError(Exception):
    """Bad usage or input: reported on stderr with exit status 2."""


def kiln_arrays(state_dict):
    """A torch state_dict as {name: contiguous little-endian numpy array}, as Kiln stores it:
    0-d tensors (BatchNorm's num_batches_tracked) become shape [1]."""
    out = {}
    for name, t in state_dict.items():
        arr = t.detach().cpu().contiguous().numpy()
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if np.dtype(arr.dtype.type) not in DTYPE_CODES:
            raise InputError("tensor '%s' has dtype %s, which a Kiln checkpoint cannot hold "
                             "(f32, f64, i32, i64, u8)" % (name, arr.dtype))
        out[name] = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False)
    return out


def _string(s):
    raw = s.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw


def checkpoint_bytes(tensors, meta=None):
    """The bytes kiln::write_checkpoint writes for `tensors` ({name: numpy array}) and `meta`
    ({key: value}, strings)."""
    meta = meta or {}
    names = sorted(tensors, key=lambda n: n.encode("utf-8"))
    keys = sorted(meta, key=lambda k: k.encode("utf-8"))
    table = bytearray()
    for k in keys:
        table += _string(k) + _string(str(meta[k]))
    record_table_bytes = sum(4 + len(n.encode("utf-8")) + 4 + 8 * tensors[n].ndim + 8 + 8 + 4
                             for n in names)
    offset = HEADER_BYTES + len(table) + record_table_bytes
    payloads = []
    for n in names:
        arr = tensors[n]
        data = arr.tobytes(order="C")
        offset = (offset + ALIGN - 1) // ALIGN * ALIGN
        payloads.append((offset, data))
        table += _string(n)
        table += struct.pack("<BBH", DTYPE_CODES[np.dtype(arr.dtype.type)], arr.ndim, 0)
        table += struct.pack("<%dq" % arr.ndim, *arr.shape)
        table += struct.pack("<QQI", offset, len(data), zlib.crc32(data))
        offset += len(data)
    header = MAGIC + struct.pack("<IIIIQI", VERSION, len(keys), len(names), zlib.crc32(table),
                                 len(table), 0)
    header += struct.pack("<I", zlib.crc32(header))
    out = bytearray(header) + table
    for at, data in payloads:
        out += b"\0" * (at - len(out)) + data
    return bytes(out)


def write_checkpoint(path, tensors, meta=None):
    """Writes checkpoint_bytes() to `path` atomically (path.tmp, fsync, rename), as Kiln does."""
    data = checkpoint_bytes(tensors, meta)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise InputError("cannot write %s: %s (check the directory exists and is writable)"
                         % (path, e.strerror))
    return len(data)


def export_meta(model_name, num_classes):
    import torchvision
    return {"format": "torchvision", "model": model_name, "num_classes": str(num_classes),
            "torchvision": torchvision.__version__}


def load_state_dict_file(path):
    """A state_dict from a torch.save'd file: a mapping of tensors or a whole nn.Module."""
    import torch
    if not os.path.isfile(path):
        raise InputError("weights file %s does not exist" % path)
    try:
        obj = torch.load(path, map_location="cpu")
    except Exception as e:  # torch raises many kinds for a file that is not a checkpoint
        raise InputError("cannot read %s with torch.load: %s" % (path, e))
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise InputError("%s does not hold a state_dict (a mapping of names to tensors) or a "
                         "model" % path)
    return obj


def state_dict_mismatch(expected, given):
    """'' when `given` has exactly the keys and shapes of `expected`, else a summary naming
    the first missing, unexpected and mis-shaped keys."""
    def first(keys):
        return "%d (first '%s')" % (len(keys), keys[0])
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    shapes = ["'%s' is %s, the model's is %s" % (k, list(given[k].shape), list(t.shape))
              for k, t in expected.items() if k in given and given[k].shape != t.shape]
    parts = []
    if missing:
        parts.append("missing keys: " + first(missing))
    if unexpected:
        parts.append("unexpected keys: " + first(unexpected))
    if shapes:
        parts.append("%d shapes differ (first: %s)" % (len(shapes), shapes[0]))
    return "; ".join(parts)


def build_model(model_name, num_classes, weights=None, seed=None):
    """A torchvision ResNet in eval mode, with the weights of `weights` (a file) or the random
    initialisation after torch.manual_seed(seed)."""
    import torch
    import torchvision
    if model_name not in MODELS:
        raise InputError("unknown model '%s': use %s" % (model_name, ", ".join(MODELS)))
    state = None
    if weights is not None:
        state = load_state_dict_file(weights)
        if num_classes is None and "fc.weight" in state and state["fc.weight"].dim() == 2:
            num_classes = int(state["fc.weight"].shape[0])
    if num_classes is None:
        num_classes = 1000
    if num_classes < 1:
        raise InputError("--num-classes must be >= 1, got %d" % num_classes)
    torch.manual_seed(0 if seed is None else seed)
    model = getattr(torchvision.models, model_name)(weights=None, num_classes=num_classes)
    if state is not None:
        problems = state_dict_mismatch(model.state_dict(), state)
        if problems:
            raise InputError("%s does not fit %s with %d classes (--num-classes sets the "
                             "classes): %s" % (weights, model_name, num_classes, problems))
        model.load_state_dict(state, strict=True)
    model.eval()
    return model, num_classes


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Export a torchvision ResNet state_dict as a Kiln checkpoint (load it "
                    "with kiln::load_torchvision_weights).")
    parser.add_argument("--model", required=True, choices=MODELS)
    parser.add_argument("--num-classes", type=int, default=None,
                        help="classes of the fc layer (default: from --weights, else 1000)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", help="a torch.save'd state_dict (.pth) to export")
    source.add_argument("--seed", type=int,
                        help="export torchvision's random initialisation after "
                             "torch.manual_seed(SEED)")
    parser.add_argument("--out", required=True, help="the Kiln checkpoint to write")
    args = parser.parse_args(argv)  # usage errors exit with status 2
    try:
        model, num_classes = build_model(args.model, args.num_classes, args.weights, args.seed)
        tensors = kiln_arrays(model.state_dict())
        size = write_checkpoint(args.out, tensors, export_meta(args.model, num_classes))
    except InputError as e:
        print("export_torchvision.py: error: %s" % e, file=sys.stderr)
        return 2
    print("wrote %s: %s, %d classes, %d tensors, %d parameters, %d bytes"
          % (args.out, args.model, num_classes, len(tensors),
             sum(p.numel() for p in model.parameters()), size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
