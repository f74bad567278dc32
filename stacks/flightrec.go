package stacks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/monitor/nvrxwire"
)

// FRState is what became of a request for a rank's flight recorder.
type FRState string

// States of a flight-recorder request ("" when none was made).
const (
	FRTaken    FRState = "taken"     // Rank.FR holds it
	FRNone     FRState = "none"      // the process has none (torch not loaded, no NCCL, no thread)
	FRNoAnswer FRState = "no_answer" // asked, nothing within the bound (its thread could not get the GIL)
)

// maxFR bounds what is read of one flight recorder: 2,000 entries without
// their stack traces are a few hundred KiB.
const maxFR = 16 << 20

// flightRecorder asks process pid's hook thread for its flight recorder
// and waits for the answer until ctx ends. The FIFO and the answer are in
// the launcher's private dump directory; neither is followed if it is a
// link, and the request is written only into a FIFO.
func (c *Collector) flightRecorder(ctx context.Context, pid int) ([]byte, FRState) {
	base := filepath.Join(c.dumpDir, strconv.Itoa(pid))
	out := base + ".fr"
	os.Remove(out) // an answer to an earlier request is not this one
	f, err := os.OpenFile(base+".frq", os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, FRNone // no FIFO: the hook kept no thread in this process
	}
	fi, err := f.Stat()
	if err == nil && fi.Mode()&os.ModeNamedPipe == 0 {
		err = errors.New("not a FIFO")
	}
	if err == nil {
		_, err = f.Write([]byte{1})
	}
	f.Close()
	if err != nil {
		return nil, FRNone
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		if b, ok := readAnswer(out); ok {
			if len(b) == 0 {
				return nil, FRNone
			}
			return b, FRTaken
		}
		select {
		case <-ctx.Done():
			return nil, FRNoAnswer
		case <-t.C:
		}
	}
}

// readAnswer reads the hook's answer, a regular file renamed into place
// once written (false while there is none).
func readAnswer(path string) ([]byte, bool) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, true // not the hook's: taken as no answer to read
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFR))
	if err != nil {
		return nil, true
	}
	return b, true
}

// FlightRecord is what a rank's flight recorder says of its collectives,
// read from torch's pickle by the restricted decoder (nothing in it is
// executed).
type FlightRecord struct {
	Version string
	Entries int
	// Pending is the oldest collective not completed: the one the rank
	// waits in when it hangs in a collective (nil when all completed).
	Pending *FRCollective
	Last    *FRCollective // the newest entry
}

// FRCollective is one entry of a flight recorder.
type FRCollective struct {
	Name  string // torch's profiling name: nccl:all_reduce
	Group string // the process group: its name, and its description when torch gives one
	Seq   int64  // the collective's sequence number in its group (p2p: the p2p one)
	State string // scheduled, started, completed
}

func (c FRCollective) String() string {
	s := fmt.Sprintf("%s #%d", c.Name, c.Seq)
	if c.Group != "" {
		s += " (group " + c.Group + ")"
	}
	return s + " " + c.State
}

// Text is the record in one line, for the stacks file, the event and the
// report, which groups ranks by it: ranks waiting in the same collective
// read the same.
func (r FlightRecord) Text() string {
	switch {
	case r.Pending != nil:
		return "in " + r.Pending.String()
	case r.Last != nil:
		return "none pending, the last " + r.Last.String()
	}
	return "no collective recorded"
}

// ParseFlightRecord reads torch's flight-recorder pickle (the dict of
// _dump_nccl_trace: version, entries, ...). Fields of every version torch
// has written are read: collective_seq_id (seq_id before 2.3),
// process_group (pg_id before).
func ParseFlightRecord(b []byte) (FlightRecord, error) {
	v, err := nvrxwire.Decode(b)
	if err != nil {
		return FlightRecord{}, fmt.Errorf("flight recorder: %w", err)
	}
	top, ok := v.(*nvrxwire.Dict)
	if !ok {
		return FlightRecord{}, fmt.Errorf("flight recorder: a %T, want a dict", v)
	}
	var r FlightRecord
	r.Version, _ = dictString(top, "version")
	ev, _ := top.Get("entries")
	entries, ok := ev.([]any)
	if ev != nil && !ok {
		return FlightRecord{}, fmt.Errorf("flight recorder: entries is a %T, want a list", ev)
	}
	r.Entries = len(entries)
	for _, e := range entries {
		d, ok := e.(*nvrxwire.Dict)
		if !ok {
			continue
		}
		c := frEntry(d)
		if r.Pending == nil && c.State != "completed" {
			r.Pending = &c
		}
		r.Last = &c
	}
	return r, nil
}

func frEntry(d *nvrxwire.Dict) FRCollective {
	var c FRCollective
	c.Name, _ = dictString(d, "profiling_name")
	c.State, _ = dictString(d, "state")
	p2p, _ := d.Get("is_p2p")
	seqKeys := []string{"collective_seq_id", "seq_id"}
	if p2p == true {
		seqKeys = []string{"p2p_seq_id", "seq_id"}
	}
	for _, k := range seqKeys {
		if n, ok := dictInt(d, k); ok {
			c.Seq = n
			break
		}
	}
	if pg, ok := d.Get("process_group"); ok {
		if t, ok := pg.(nvrxwire.Tuple); ok {
			var parts []string
			for _, p := range t {
				if s, ok := p.(string); ok && s != "" {
					parts = append(parts, s)
				}
			}
			c.Group = strings.Join(parts, " ")
		}
	}
	if c.Group == "" {
		if n, ok := dictInt(d, "pg_id"); ok {
			c.Group = strconv.FormatInt(n, 10)
		}
	}
	return c
}

func dictString(d *nvrxwire.Dict, k string) (string, bool) {
	v, ok := d.Get(k)
	s, ok2 := v.(string)
	return s, ok && ok2
}

func dictInt(d *nvrxwire.Dict, k string) (int64, bool) {
	v, ok := d.Get(k)
	if !ok {
		return 0, false
	}
	switch n := v.(type) {
	case int64:
		return n, true
	case *big.Int:
		if n.IsInt64() {
			return n.Int64(), true
		}
	}
	return 0, false
}
