"""Peer heal for in-process restarts (docs/state.md, "Peer heal").

After an in-process rejoin the survivors still hold the live state of the
last step they completed; the rank that replaced the failed one holds
nothing. ``heal`` lets every rank of the new round agree on that step
through the round's store (the launcher's TCPStore, under the round's key
prefix) and sends a survivor's state to the replacement(s) over the new
process group, so that no file and no launcher-memory copy is read and the
work lost is the failed step only:

    model, opt = build()            # once per process: survivors keep them
    done = [None]                   # the last step this process completed

    def train(ctx):
        live = None if done[0] is None else {"model": model.state_dict(), "opt": opt.state_dict()}
        step, st = ctx.state.heal(done[0], live)
        if st is not None and st is not live:
            model.load_state_dict(st["model"]); opt.load_state_dict(st["opt"])
        for s in range(0 if step is None else step + 1, steps):
            ...one step, optimizer step included...
            done[0] = s             # before ctx.step(): it may raise RestartNotice
            ctx.step()

When the survivors disagree on the step (a failure between two ranks'
optimizer steps), or a replica group lost every member, every rank falls
back to ``state.load()`` (the newest committed save: launcher memory, then
the state directory) and says so (a warning, and the restore note the
launcher records). Without a process group, or alone in it, there is
nothing to heal: a live state is returned as it is, otherwise what
``load()`` returns.

Standard library only at import; torch when a process group is there.

The code is ft_launcher_client.state.peerheal (the peer heal is part of
the state package, above the load it falls back to and the transport it
sends with); this module is its public name.
"""

from .state.peerheal import (  # noqa: F401 (the public API)
    DEFAULT_TIMEOUT,
    FALLBACK,
    KEPT,
    KEY_PREFIX,
    LOAD,
    PEER,
    check_groups,
    decide,
    heal,
    log,
)

__all__ = ["heal", "decide", "check_groups", "PEER", "KEPT", "LOAD", "FALLBACK"]
