"""Sending a live state to a peer over the round's process group.

The peer heal's transport (peerheal.py; torchft's PGTransport plays the
same part): a survivor sends its live state to the replacement(s) of its
replica group, and a replacement receives it, with no file and no copy in
the launcher's memory on the way. The state travels in the save's own
terms (format.py): the restricted skeleton, then each tensor's bytes
straight from and into its memory. torch only inside the calls.
"""

from .common import StateError
from .format import Pickler, Unpickler


def _bytes_of(t):
    """The bytes of a contiguous tensor as a flat uint8 tensor (a view)."""
    import torch

    return t.reshape(-1).view(torch.uint8)


def _device(dist):
    import torch

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def send(dist, st, dsts):
    """Send st to each of dsts: a header (skeleton length, tensor count),
    the skeleton (format.Pickler, tensors replaced by references), then
    each tensor's bytes straight from its memory (no staging copy of a
    contiguous CPU tensor). Returns the bytes sent to one destination."""
    import io

    import torch

    dev = _device(dist)
    tensors = []
    f = io.BytesIO()
    Pickler(f, tensors).dump(st)  # contiguous CPU tensors, as a save makes them
    skel = torch.frombuffer(bytearray(f.getvalue()), dtype=torch.uint8)
    head = torch.tensor([skel.numel(), len(tensors)], dtype=torch.int64)
    msgs = [head, skel] + [_bytes_of(t) for t in tensors if t.numel()]
    msgs = [m.to(dev) for m in msgs]
    for d in dsts:  # one after the other: a survivor with K replacements sends K copies
        for m in msgs:
            dist.send(m, d)
    return sum(m.numel() for m in msgs[1:])


def recv(dist, src):
    """Receive a state send() sent: each tensor is allocated with
    torch.empty and received straight into its memory (on the CPU, as
    load() returns them). Returns (state, bytes)."""
    import io

    import torch

    dev = _device(dist)
    head = torch.zeros(2, dtype=torch.int64, device=dev)
    dist.recv(head, src)
    skel_len, ntensors = (int(x) for x in head.cpu().tolist())
    skel = torch.empty(skel_len, dtype=torch.uint8, device=dev)
    dist.recv(skel, src)
    data = skel.cpu().numpy().tobytes()
    metas = {}

    def collect(idx, dtype, shape):
        metas[idx] = (dtype, shape)
        return (idx,)

    Unpickler(io.BytesIO(data), collect).load()
    if len(metas) != ntensors:
        raise StateError("peer heal: %d tensors described, %d announced" % (len(metas), ntensors))
    tensors, n = [], len(data)
    for idx in range(ntensors):
        dtype, shape = metas[idx]
        dt = getattr(torch, dtype, None)
        if not isinstance(dt, torch.dtype):
            raise StateError("peer heal: unknown dtype %r" % dtype)
        t = torch.empty(shape, dtype=dt)
        if t.numel():
            b = _bytes_of(t)
            if dev.type == "cpu":
                dist.recv(b, src)
            else:
                tmp = torch.empty(b.numel(), dtype=torch.uint8, device=dev)
                dist.recv(tmp, src)
                b.copy_(tmp)
            n += b.numel()
        tensors.append(t)
    return Unpickler(io.BytesIO(data), lambda i, d, s: tensors[i]).load(), n
