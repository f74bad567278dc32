"""What every module of the state package shares: the errors a save or a
load raises, the environment it reads, and the one logger.

Its own module, below all the others, so that the byte format, the
segment, the files, the overlapped save and the restore can each raise
StateError and read $RANK without importing one another (the errors used
to live at the top of one 1,700-line state.py that every concern shared).
"""

import logging
import os

# One logger for the whole package, named as the single module was
# ("ft_launcher_client.state"): the records, and the handlers and levels
# users set on that name, stay what they were.
log = logging.getLogger(__package__)

SHM_DIR_ENV = "FT_STATE_SHM_DIR"
DIR_ENV = "FT_STATE_DIR"
DEFAULT_DIR = "ft_state"  # the fallback directory without ft-launcher
COPY_THREADS_ENV = "FT_STATE_COPY_THREADS"

# The opt-in for other classes than TRUSTED_BY_DEFAULT (format.py): a
# comma-separated list of "module.name" (or "module:name"), or "*" to trust
# every class of the state (as torch.load(weights_only=False) does: only
# for states you wrote).
TRUSTED_CLASSES_ENV = "FT_STATE_TRUSTED_CLASSES"


class StateError(Exception):
    """A state that cannot be saved or loaded (the message says why)."""


class CorruptStateWarning(UserWarning):
    """load() found a save that failed its integrity check (its CRC, or
    the consistency of its descriptor and payload) and restored an older
    source instead."""


class UntrustedClassError(StateError):
    """A state's skeleton names a class or function that a training state
    does not hold and the caller did not trust: nothing of it ran."""


class Mismatch(StateError):
    """load(into=...): the caller's structure does not match the save."""


class NoRoom(StateError):
    """The segment would not fit in memory; the save goes to a file."""


def pad8(n):
    """The zero bytes that pad n bytes to a multiple of 8."""
    return (8 - n % 8) % 8


def this_rank():
    """This process's global rank ($RANK, 0 when unset)."""
    return int(os.environ.get("RANK", "0") or "0")
