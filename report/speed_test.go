package report

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// TestSpeeds: the nodes' rank_speed records become a speed lane per node
// (in the JSON and on the page), and a straggler record a mark with what
// was done.
func TestSpeeds(t *testing.T) {
	speed := func(node, ts string, sp float64) string {
		return fmt.Sprintf(`{"event":"rank_speed","node":%q,"round":0,"run_id":"r1","ts":"2026-01-01T00:00:%sZ","window_s":10,"node_speed":%g,"ranks":[{"rank":0,"local_rank":0,"busy":0.9,"speed":%g}]}`,
			node, ts, sp, sp)
	}
	n1 := hangNodeLines("n1", 0, 4, speed("n1", "10", 1.1), speed("n1", "15", 1.9))
	n2 := hangNodeLines("n2", 1, 4, speed("n2", "10", 0.95), speed("n2", "15", 0.45),
		`{"event":"straggler","node":"n2","round":0,"run_id":"r1","ts":"2026-01-01T00:00:16Z","speed":0.45,"slow_for_s":16,"mode":"swap","action":"swapping"}`)
	r := buildFromLogs(t, n1, n2)
	if len(r.Speeds) != 2 {
		t.Fatalf("speeds %+v, want 2 nodes", r.Speeds)
	}
	s2 := r.Speeds[1]
	if s2.Node != "n2" || len(s2.Samples) != 2 || s2.Samples[1].Speed != 0.45 || len(s2.Stragglers) != 1 || s2.Stragglers[0].Action != "swapping" {
		t.Fatalf("n2's speeds %+v", s2)
	}
	var page bytes.Buffer
	if err := r.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Speed (each node against the others", "speed 0.45", "swapping (speed 0.45)"} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Without speed records: no lane.
	r = buildFromLogs(t, hangNodeLines("n1", 0, 2))
	page.Reset()
	if err := r.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	if len(r.Speeds) != 0 || strings.Contains(page.String(), "Speed (each node") {
		t.Errorf("a run without speed records has a speed lane")
	}
}
