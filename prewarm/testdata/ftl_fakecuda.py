"""A fake for a GPU (prewarm tests): no GPU here, so this module stands
for an import that created a CUDA context. It installs a stand-in `torch`
module whose torch.cuda.is_initialized() is true, which is all the standby
looks at; the standby must then refuse to become a rank.
"""
import sys
import types

_torch = types.ModuleType("torch")
_torch.cuda = types.SimpleNamespace(is_initialized=lambda: True)
sys.modules["torch"] = _torch
