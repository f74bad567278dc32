"""nvidia-smi's per-process device memory, shared by the GPU probes."""
import subprocess


def used_mib(pid):
    """The device memory (MiB) nvidia-smi lists for pid, or None when it
    lists none for it (no CUDA context)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        p, _, m = line.partition(",")
        if p.strip() == str(pid):
            return int(m)
    return None
