"""Training state kept by ft-launcher (docs/state.md).

    from ft_launcher_client import state

    step, saved = state.load()              # (None, None) on the first run
    if saved is not None:
        model.load_state_dict(saved["model"]); opt.load_state_dict(saved["opt"])
    for step in range(0 if step is None else step + 1, steps):
        ...one step...
        state.save(step, {"model": model.state_dict(), "opt": opt.state_dict()})

Under ft-launcher with ``--state-dir`` a save copies the state into a
shared-memory segment that the rank's launcher owns
($FT_STATE_SHM_DIR/rank-$LOCAL_RANK): it outlives the rank, and the process
that next holds the rank loads it from memory (a memory copy into new
tensors, not a deserialisation; with ``load(into=...)`` straight into the
tensors the caller already has). The launcher writes committed saves to
--state-dir in the background. Without ft-launcher, or when the segment would
not fit in memory, save() writes the same format to a file (atomically) and
load() reads it; ``load_file(path)`` reads a written-out state anywhere.
Saves and loads split their copy across copy_threads() threads
($FT_STATE_COPY_THREADS); ``save(..., overlap=True)`` copies in the
background until ``wait()``, and is not committed if a saved tensor was
changed in place meanwhile.

Standard library only; torch is used only when the state holds tensors
(and is never imported here). The pickled part of a state (its skeleton:
the containers around the tensors) is read by a restricted unpickler that
admits only what a training state holds (TRUSTED_BY_DEFAULT: containers,
numbers, strings, bytes, OrderedDict, torch dtypes, devices and Size,
numpy arrays and dtypes); anything else, from a launcher's memory, a
buddy, a peer or a file, is refused with an UntrustedClassError naming the
class, unless the caller opts in: ``load(..., trusted_classes=[...])`` or
$FT_STATE_TRUSTED_CLASSES (docs/state.md, "What a load executes").

The package is split by concern, each module below the ones that use it
(no module imports one above it, none reaches into another's private
names; tests/test_state.py checks both):

    common.py     errors, environment, logger (below everything)
    copying.py    the copy threads and the byte-moving primitives
    into.py       load(into=...): matching a save to the caller's tensors
    format.py     the bytes: segment and file headers, slot descriptors,
                  pin, payload, CRC-32, the restricted unpickler
    segment.py    the launcher's /dev/shm segment: slots, mapping, saver
    files.py      the state directory: written-out files and manifests
    saving.py     save() and the overlapped save in flight (wait())
    restore.py    load(): the newest intact source, the restore note
    transport.py  a live state sent to a peer over the process group
    peerheal.py   the peer heal (ft_launcher_client.heal)
    bound.py      state.heal() and Bound (ctx.state)

This file only names the public API; the modules are the package's own.
"""

from .bound import Bound, heal
from .common import (
    COPY_THREADS_ENV,
    DEFAULT_DIR,
    DIR_ENV,
    SHM_DIR_ENV,
    TRUSTED_CLASSES_ENV,
    CorruptStateWarning,
    StateError,
    UntrustedClassError,
    log,
)
from .copying import copy_threads
from .files import load_file
from .format import (
    DESC_OFF,
    FILE_HEADER,
    FILE_MAGIC,
    FILE_VERSION,
    FLAG_CRC,
    FLAG_SAVE_CRC,
    HEADER,
    MAGIC,
    MANIFEST_FORMAT,
    PIN_OFF,
    TRUSTED_BY_DEFAULT,
)
from .restore import load
from .saving import save, wait

__all__ = [
    "save", "load", "wait", "heal", "load_file", "copy_threads", "Bound",
    "StateError", "CorruptStateWarning", "UntrustedClassError",
    "TRUSTED_BY_DEFAULT", "TRUSTED_CLASSES_ENV",
    "SHM_DIR_ENV", "DIR_ENV", "DEFAULT_DIR", "COPY_THREADS_ENV",
    "MAGIC", "HEADER", "DESC_OFF", "FLAG_CRC", "FLAG_SAVE_CRC", "PIN_OFF",
    "FILE_MAGIC", "FILE_HEADER", "FILE_VERSION", "MANIFEST_FORMAT",
]
