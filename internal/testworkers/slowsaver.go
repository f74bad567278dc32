// Package testworkers holds rank programs that tests of several packages
// run under the real launcher, so each is written once.
package testworkers

import (
	"fmt"
	"os"
	"path/filepath"
)

// SlowSaver is a Python rank (argv[1]: an output directory) that creates
// ready<RANK> once it runs, and whose SIGTERM handler needs 2 s before it
// writes its checkpoint ckpt<RANK>.bin (1 MiB and an END line, to a
// temporary file, fsynced and renamed: complete or absent) and exits 0. It
// ignores further SIGTERMs, as a careful training script does: at a time
// limit slurmstepd signals every process of the step, the ranks included,
// and more than once.
const SlowSaver = `import os, signal, sys, time
out, rank = sys.argv[1], os.environ["RANK"]
def save(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    t0 = time.monotonic()
    time.sleep(2)
    path = os.path.join(out, "ckpt%s.bin" % rank)
    with open(path + ".tmp", "wb") as f:
        f.write(b"x" * (1 << 20) + b"END\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    print("rank %s saved %.2f s after SIGTERM" % (rank, time.monotonic() - t0), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
open(os.path.join(out, "ready%s" % rank), "w").close()
while True:
    time.sleep(0.05)
`

// SlowSaverCheckpoint checks that dir holds rank's whole SlowSaver
// checkpoint.
func SlowSaverCheckpoint(dir string, rank int) error {
	b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("ckpt%d.bin", rank)))
	if err != nil {
		return fmt.Errorf("rank %d did not save its checkpoint: %w", rank, err)
	}
	if len(b) != 1<<20+4 || string(b[len(b)-4:]) != "END\n" {
		return fmt.Errorf("rank %d's checkpoint is incomplete: %d bytes", rank, len(b))
	}
	return nil
}
