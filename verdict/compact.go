package verdict

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"unicode/utf8"

	"github.com/ftlauncher/ft-launcher/ledger"
)

// TerminationMessageLimit is the most the kubelet keeps of a container's
// termination message (bytes); it drops the rest.
const TerminationMessageLimit = 4096

// Compact encodes v as one line of JSON of the verdict schema (Parse reads
// it, Schema set) in at most limit bytes, shedding what an outer loop
// needs least until it fits:
//
//  1. the cycles, the ledger, the etcd member failures, prewarm_auto and
//     the fence watchdog's list of deaths (cycles_total and its restarts
//     and gave_up stay);
//  2. the length of the reason, the quarantine and failing-node details
//     and the other strings;
//  3. the quarantine entries' detail, round and time, one entry per host,
//     then the entries that do not fit, last first, the reason cut shorter
//     still where that keeps more (node, host and evidence stay: a
//     controller keeps its pods off those hosts); quarantined_omitted
//     counts what was left out.
//
// It fails when even that does not fit (a limit of a few hundred bytes), or
// for an unknown kind. v itself is not changed.
func Compact(v Verdict, limit int) ([]byte, error) {
	if !v.Kind.Valid() {
		return nil, fmt.Errorf("verdict: unknown kind %q", v.Kind)
	}
	v.Schema = Schema
	v.Quarantined = append([]Quarantine{}, v.Quarantined...) // entries are shortened below
	if v.Cycles == nil {
		v.Cycles = []Cycle{}
	}
	if v.Ledger == nil {
		v.Ledger = []ledger.Record{}
	}
	if b, err := encode(v); err != nil || len(b) <= limit {
		return b, err
	}

	v.Cycles, v.Ledger, v.EtcdMemberFailures, v.PrewarmAuto = []Cycle{}, []ledger.Record{}, nil, nil
	if v.FenceWatchdog != nil { // the counts and the reason stay, the list goes
		fw := *v.FenceWatchdog
		fw.Deaths = nil
		v.FenceWatchdog = &fw
	}
	if b, err := encode(v); err != nil || len(b) <= limit {
		return b, err
	}

	text, detail := max(limit/4, 64), max(limit/32, 16)
	v.Reason = truncate(v.Reason, text)
	for i := range v.Quarantined {
		v.Quarantined[i].Detail = truncate(v.Quarantined[i].Detail, detail)
	}
	if v.FailingNode != nil { // its rounds and swapped_out stay: a controller keeps off the node
		fn := *v.FailingNode
		fn.Detail = truncate(fn.Detail, text)
		v.FailingNode = &fn
	}
	short := max(limit/16, 32)
	for _, s := range []*string{&v.RunID, &v.Node, &v.Hostname, &v.Signal, &v.FinishedFlag.Path} {
		*s = truncate(*s, short)
	}
	if b, err := encode(v); err != nil || len(b) <= limit {
		return b, err
	}

	// Host names outweigh the reason's tail: a shorter reason is taken
	// when it keeps more hosts.
	hosts := slimQuarantine(v.Quarantined, short)
	best, bestN := "", -1
	for _, reason := range []string{v.Reason, truncate(v.Reason, short)} {
		v.Reason = reason
		// The largest prefix of hosts that fits: the size grows with it.
		n := sort.Search(len(hosts)+1, func(n int) bool {
			b, err := encodeSlim(v, hosts, n)
			return err != nil || len(b) > limit
		}) - 1
		if n > bestN {
			best, bestN = reason, n
		}
		if n == len(hosts) {
			break
		}
	}
	if bestN < 0 {
		b, _ := encodeSlim(v, nil, 0)
		return nil, fmt.Errorf("verdict: cannot compact to %d bytes: at least %d needed", limit, len(b))
	}
	v.Reason = best
	return encodeSlim(v, hosts, bestN)
}

// WriteTerminationMessage writes v, compacted to TerminationMessageLimit
// bytes, to path: the container's termination message
// (/dev/termination-log), which the kubelet copies into the pod's status
// once the container has exited.
//
// Unlike Write this truncates and writes in place. The kubelet bind-mounts
// that one file into the container, so renaming a temporary file over it
// fails (EBUSY: it is a mount point) and a file created beside it is not
// the one the kubelet reads. Nothing reads it before the container exits,
// which happens after this returns, so no reader sees a partial message.
func WriteTerminationMessage(path string, v Verdict) error {
	b, err := Compact(v, TerminationMessageLimit)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("verdict: termination message: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("verdict: termination message %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("verdict: termination message %s: %w", path, err)
	}
	return nil
}

// hostEntry is a quarantine entry reduced to what keeps a workload off a
// bad node.
type hostEntry struct {
	Node     string   `json:"node"`
	Host     string   `json:"host,omitempty"`
	Evidence Evidence `json:"evidence"`
}

// slimVerdict is a Verdict whose quarantined list holds hostEntry values:
// the outer field shadows the embedded one in encoding/json.
type slimVerdict struct {
	Verdict
	Quarantined []hostEntry `json:"quarantined"`
}

// slimQuarantine reduces the entries to hostEntry, the first per host (or
// per node where the host is unknown), strings cut to short bytes.
func slimQuarantine(q []Quarantine, short int) []hostEntry {
	seen := map[string]bool{}
	var out []hostEntry
	for _, e := range q {
		key := "host " + e.Host
		if e.Host == "" {
			key = "node " + e.Node
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, hostEntry{Node: truncate(e.Node, short), Host: truncate(e.Host, short), Evidence: e.Evidence})
	}
	return out
}

// encodeSlim encodes v with the first n of hosts as its quarantined list.
func encodeSlim(v Verdict, hosts []hostEntry, n int) ([]byte, error) {
	v.QuarantinedOmitted += len(v.Quarantined) - n
	return encode(slimVerdict{Verdict: v, Quarantined: append([]hostEntry{}, hosts[:n]...)})
}

// encode is compact JSON without HTML escaping (which would grow '<' to six
// bytes) and without the encoder's newline.
func encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("verdict: encode: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// truncate cuts s to at most n bytes on a character boundary, ending in
// "…" when it cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := max(n-len(ellipsis), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
