"""Checkpoints in the safetensors format (docs/job-channel.md), in plain
Python: an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range (and `__metadata__`, strings only),
then the tensors' bytes. No third-party package: a framework hands bytes
(PyTorch: tensor.numpy().tobytes()) and gets them back."""
import json
import os
import struct

from .job import write_atomically

DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
MAX_HEADER = 100 * 1024 * 1024


class FormatError(ValueError):
    """A file that is not a safetensors file; the message names the file and the field."""


def save(path, tensors, metadata=None):
    """Write path atomically: tensors is {name: (dtype, shape, bytes)} with a
    dtype of DTYPES; metadata {str: str}. Returns (bytes, seconds)."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        if dtype not in DTYPES:
            raise ValueError(f"tensor {name}: dtype {dtype!r} is not one of {sorted(DTYPES)}")
        n = 1
        for d in shape:
            n *= int(d)
        if len(data) != n * DTYPES[dtype]:
            raise ValueError(f"tensor {name}: {len(data)} bytes for shape {list(shape)} of {dtype}")
        header[name] = {"dtype": dtype, "shape": [int(d) for d in shape], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)

    def write(f):
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    return write_atomically(path, write)


def load(path):
    """(tensors, metadata) of a safetensors file: {name: (dtype, shape,
    bytes)} and {str: str}. Raises FormatError naming the field."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise FormatError(f"{path}: {len(data)} bytes, shorter than the header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise FormatError(f"{path}: header length {n} exceeds the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise FormatError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    body = memoryview(data)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, t in header.items():
        try:
            dtype, shape, (begin, end) = t["dtype"], t["shape"], t["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"{path}: tensor {name}: needs dtype, shape and data_offsets") from None
        count = 1
        for d in shape:
            count *= d
        if dtype not in DTYPES or not (0 <= begin <= end <= len(body)) or end - begin != count * DTYPES[dtype]:
            raise FormatError(f"{path}: tensor {name}: dtype {dtype}, shape {shape}, data_offsets {[begin, end]} "
                              f"do not fit the file")
        tensors[name] = (dtype, shape, bytes(body[begin:end]))
    return tensors, metadata


def step_of(path):
    """The step of a checkpoint named step-NNNNNNNN.*, or None."""
    name = os.path.basename(path)
    if name.startswith("step-") and len(name) > 13 and name[5:13].isdigit():
        return int(name[5:13])
    return None
