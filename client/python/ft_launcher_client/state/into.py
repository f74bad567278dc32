"""load(into=...): restoring a save straight into the caller's tensors.

The payload decoder (format.py) reads a save's skeleton twice: a first
pass that yields a Ref for each saved tensor, which Into matches against
the structure the caller passed (nested dicts, lists, tuples; modules and
optimizers as their state_dicts) before a single byte is written, and a
second that builds the state around the tensors filled. Its own module:
the matching is the one part of a load that knows torch's modules and
optimizers, and the format must not need to.
"""

from .common import Mismatch, StateError


class Ref:
    """A saved tensor in the skeleton's first pass: its index, dtype, shape."""

    __slots__ = ("idx", "dtype", "shape")

    def __init__(self, idx, dtype, shape):
        self.idx, self.dtype, self.shape = idx, dtype, tuple(shape)


def path_text(p):
    """A place in a state, as the messages write it: ['opt']['state'][0]."""
    return "".join("[%r]" % k for k in p) or "the state"


class Into:
    """Where load(into=...) puts each saved tensor: the caller's tensors at
    the same place in the structure (nested dicts, lists, tuples; an
    nn.Module or an optimizer stands for its state_dict()). Everything is
    checked before a byte is written: a saved tensor whose destination has
    another shape or dtype, or a destination tensor the save does not hold,
    is a StateError naming its place."""

    def __init__(self, into, skel):
        import torch

        self.torch = torch
        self.dests = {}  # tensor index -> [(path, tensor)]
        self.modules = []  # (path, module, saved sub-dict)
        self.optims = []  # (path, optimizer, saved sub-dict, its state_dict())
        try:
            self._walk(skel, into, ())
        except StateError as e:  # the caller's structure, not a damaged save (load() tells them apart)
            raise Mismatch(str(e)) from None

    def _walk(self, skel, into, path):
        torch = self.torch
        if into is None:
            return
        if isinstance(into, torch.nn.Module):
            if not isinstance(skel, dict):
                raise StateError("load(into=...): %s is a module but the save holds a %s there" % (path_text(path), type(skel).__name__))
            sd = into.state_dict()
            missing = [k for k in sd if k not in skel]
            extra = [k for k in skel if k not in sd]
            if missing or extra:
                raise StateError("load(into=...): the module at %s does not match the save: missing from the save %s, "
                                 "not in the module %s" % (path_text(path), missing[:8], extra[:8]))
            self.modules.append((path, into, skel))
            into = sd
        elif isinstance(into, torch.optim.Optimizer):
            if not (isinstance(skel, dict) and isinstance(skel.get("state"), dict)
                    and isinstance(skel.get("param_groups"), list)):
                raise StateError("load(into=...): %s is an optimizer but the save holds no optimizer state_dict there" % path_text(path))
            sd = into.state_dict()
            sizes = [len(g["params"]) for g in sd["param_groups"]]
            saved = [len(g.get("params", ())) for g in skel["param_groups"]]
            if sizes != saved:
                raise StateError("load(into=...): the optimizer at %s has param groups of %s parameters, the save %s"
                                 % (path_text(path), sizes, saved))
            self.optims.append((path, into, skel, sd))
            into = sd["state"]
            skel = skel["state"]
            path = path + ("state",)
        if isinstance(skel, Ref):
            if not isinstance(into, torch.Tensor):
                raise StateError("load(into=...): the save holds a tensor at %s, into holds a %s" % (path_text(path), type(into).__name__))
            want = getattr(torch, skel.dtype, None)
            if into.dtype != want or tuple(into.shape) != skel.shape:
                raise StateError("load(into=...): %s: saved %s %s, into has %s %s (shape and dtype must match)"
                                 % (path_text(path), skel.dtype, list(skel.shape), str(into.dtype).replace("torch.", ""), list(into.shape)))
            if into.layout != torch.strided:
                raise StateError("load(into=...): %s: a %s tensor; only dense (strided) tensors can be restored into" % (path_text(path), into.layout))
            self.dests.setdefault(skel.idx, []).append((path, into))
        elif isinstance(into, torch.Tensor):
            raise StateError("load(into=...): into holds a tensor at %s, the save a %s" % (path_text(path), type(skel).__name__))
        elif isinstance(into, dict):
            if not isinstance(skel, dict):
                raise StateError("load(into=...): into holds a dict at %s, the save a %s" % (path_text(path), type(skel).__name__))
            for k, v in into.items():
                if k not in skel:
                    if has_tensor(v, torch):
                        raise StateError("load(into=...): %s is not in the save" % path_text(path + (k,)))
                    continue
                self._walk(skel[k], v, path + (k,))
        elif isinstance(into, (list, tuple)):
            if not isinstance(skel, (list, tuple)) or len(skel) != len(into):
                raise StateError("load(into=...): into holds a %s of %d at %s, the save a %s" % (
                    type(into).__name__, len(into), path_text(path), type(skel).__name__ + (" of %d" % len(skel) if isinstance(skel, (list, tuple)) else "")))
            for i, (s, v) in enumerate(zip(skel, into)):
                self._walk(s, v, path + (i,))
        # Anything else in into (numbers, strings) is ignored: non-tensor
        # values come from the save.

    def direct(self, idx):
        """The caller's tensor whose memory can take the bytes as they are
        (CPU, contiguous, no conjugate or negative view bit), or None."""
        for _, t in self.dests.get(idx, ()):
            if t.device.type == "cpu" and t.is_contiguous() and not t.is_conj() and not t.is_neg():
                return t
        return None

    def fill_rest(self, idx, src):
        """Copy src (the saved tensor) into the idx's other destinations."""
        torch = self.torch
        with torch.no_grad():
            for _, t in self.dests.get(idx, ()):
                if t is not src:
                    t.copy_(src)

    def finish(self, state_skel_result):
        """Hand non-tensor parts to the modules and optimizers given as into."""
        torch = self.torch
        for path, mod, saved in self.modules:
            sub = at(state_skel_result, path)
            rest = {k: v for k, v in sub.items() if not isinstance(v, torch.Tensor)}
            if rest:  # e.g. a module's _extra_state
                mod.load_state_dict(rest, strict=False)
        for path, opt, saved, sd in self.optims:
            sub = at(state_skel_result, path)
            filled = all(all(not isinstance(v, torch.Tensor) or k in sd["state"].get(pid, {})
                             for k, v in ps.items()) for pid, ps in sub["state"].items()) \
                and set(sub["state"]) == set(sd["state"])
            if not filled:
                # A fresh optimizer (no state yet): torch's own load, which
                # copies the state as it does after torch.load.
                opt.load_state_dict(sub)
                continue
            params = [p for g in opt.param_groups for p in g["params"]]
            for pid, ps in sub["state"].items():
                live = opt.state[params[pid]]
                for k, v in ps.items():
                    if not isinstance(v, torch.Tensor):
                        live[k] = v
            for g, sg in zip(opt.param_groups, sub["param_groups"]):
                for k, v in sg.items():
                    if k != "params":
                        g[k] = v


def has_tensor(v, torch):
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, dict):
        return any(has_tensor(x, torch) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(has_tensor(x, torch) for x in v)
    return isinstance(v, (torch.nn.Module, torch.optim.Optimizer))


def at(obj, path):
    for k in path:
        obj = obj[k]
    return obj
