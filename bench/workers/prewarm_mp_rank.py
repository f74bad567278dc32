"""bench/prewarm_mp.py's rank: runs multiprocessing workers, records what they and the imports saw."""
import json, os, sys, time
ARGV_AT_IMPORT = list(sys.argv)
PRE = sorted(m for m in ("torch", "ftl_argvlib", "torch._dynamo") if m in sys.modules)
import multiprocessing as mp
import ftl_argvlib


def child(x):
    return {"x": x * x, "argv": sys.argv, "pythonpath": os.environ.get("PYTHONPATH"),
            "report": os.environ.get("FT_LAUNCHER_PREWARM_REPORT"), "hook_mod": "_ftl_learn" in sys.modules,
            "hook_path": any("ft-launcher-prewarm-" in p for p in sys.path), "torch": "torch" in sys.modules}


if __name__ == "__main__":
    import torch  # learned: the next standbys import it
    rnd = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rec = {"pre": PRE, "argv_at_import": ARGV_AT_IMPORT, "argvlib": ftl_argvlib.ARGV, "argv": sys.argv}
    t = time.monotonic()
    for method in ("spawn", "forkserver", "fork"):
        try:
            with mp.get_context(method).Pool(2) as p:
                rec[method] = p.map(child, [1, 2])
        except Exception as e:
            rec[method] = "FAILED: %r" % e
    rec["pool_s"] = time.monotonic() - t
    if os.environ.get("DATALOADER"):
        import torch
        from torch.utils.data import DataLoader
        for method in ("spawn", "forkserver", "fork"):
            t = time.monotonic()
            try:
                dl = DataLoader(list(range(8)), batch_size=2, num_workers=2, multiprocessing_context=method)
                rec["dl_" + method] = [b.tolist() for b in dl]
            except Exception as e:
                rec["dl_" + method] = "FAILED: %r" % e
            rec["dl_%s_s" % method] = time.monotonic() - t
    out = os.environ["OUT"]
    with open(os.path.join(out, "rec-%d.json" % rnd), "w") as f:
        json.dump(rec, f)
    last = int(os.environ["LAST"])
    while rnd < last and not os.path.exists(os.path.join(out, "go-%d" % rnd)):
        time.sleep(0.05)
    sys.exit(1 if rnd < last else 0)
