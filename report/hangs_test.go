package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/stacks"
)

// hangNodeLines are one node's records of a job whose round 0 hangs (its
// ranks killed at 20.5 s, restarted at 21 s) and whose round 1 succeeds:
// node group runs global ranks 2*group and 2*group+1 of world. extra are
// the node's records of the hang (the log is sorted by time on load).
func hangNodeLines(node string, group, world int, extra ...string) []string {
	ev := func(ts, body string) string {
		return fmt.Sprintf(`{%s,"node":%q,"run_id":"r1","ts":"2026-01-01T00:00:%sZ"}`, body, node, ts)
	}
	g0, g1 := 2*group, 2*group+1
	lines := []string{
		ev("00", `"event":"launcher_started","nproc_per_node":2`),
		ev("01", fmt.Sprintf(`"event":"cycle_started","group_rank":%d,"pids":[%d,%d],"round":0,"world_size":%d`, group, 10*group+10, 10*group+11, world)),
	}
	for round, at := range []string{"03", "24"} {
		for l, g := range []int{g0, g1} {
			lines = append(lines, ev(at, fmt.Sprintf(`"at":"2026-01-01T00:00:%sZ","event":"rank_first_heartbeat","local_rank":%d,"rank":%d,"round":%d`, at, l, g, round)))
		}
	}
	for l, g := range []int{g0, g1} {
		lines = append(lines,
			ev("20.5", fmt.Sprintf(`"event":"rank_exited","exit_code":-9,"signal":"SIGKILL","local_rank":%d,"rank":%d,"round":0`, l, g)),
			ev("30", fmt.Sprintf(`"event":"rank_exited","exit_code":0,"local_rank":%d,"rank":%d,"round":1`, l, g)))
	}
	lines = append(lines,
		ev("21", `"after_round":0,"event":"restart","reason":"hang"`),
		ev("22", fmt.Sprintf(`"event":"cycle_started","group_rank":%d,"pids":[%d,%d],"round":1,"world_size":%d`, group, 10*group+12, 10*group+13, world)),
		ev("30", `"event":"job_succeeded","round":1`))
	for _, x := range extra {
		lines = append(lines, x)
	}
	return lines
}

// stacksLine is a node's rank_stacks record of round 0.
func stacksLine(t *testing.T, node, ts string, ev eventlog.RankStacksEvent) string {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`{"event":"rank_stacks","node":%q,"run_id":"r1","ts":"2026-01-01T00:00:%sZ",%s`, node, ts, b[1:])
}

// hangLine is a node's rank_hang record of round 0 (signalled at 20.02 s,
// silent for 10 s).
func hangLine(node string, local, rank int, judged bool, finding string) string {
	return fmt.Sprintf(`{"elapsed_s":10,"event":"rank_hang","judged":%t,"finding":%q,"local_rank":%d,"node":%q,"rank":%d,"round":0,"run_id":"r1","section":"","signal":"SIGKILL","signalled_at":"2026-01-01T00:00:20.02Z","timeout_kind":"heartbeat","ts":"2026-01-01T00:00:20.02Z"}`,
		judged, finding, local, node, rank)
}

// buildFromLogs builds the report of one event log per node.
func buildFromLogs(t *testing.T, logs ...[]string) *Report {
	t.Helper()
	dir := t.TempDir()
	var in Inputs
	for i, lines := range logs {
		path := filepath.Join(dir, fmt.Sprintf("node%d.jsonl", i))
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		in.EventLogs = append(in.EventLogs, path)
	}
	r, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestHangs: the stacks taken at a hang name its culprit first on the
// page and in the JSON, the round's reason is the finding, and a report
// without rank_stacks records is as before.
func TestHangs(t *testing.T) {
	dir := t.TempDir()
	// The culprit's stacks file, as the launcher writes it beside the
	// rank's logs; its text must be escaped on the page.
	culpritFile := filepath.Join(dir, "attempt_0", "1", stacksName)
	if err := os.MkdirAll(filepath.Dir(culpritFile), 0o755); err != nil {
		t.Fatal(err)
	}
	dump := stacksHeader + "local rank 1 (rank 1, pid 11), taken 2026-01-01T00:00:20.01Z before it or a peer was killed\n" +
		"# at: train.py:60 in <lambda> (user)\n\nCurrent thread 0x00007f (most recent call first):\n" +
		"  File \"train.py\", line 60 in <lambda>\n  File \"train.py\", line 99 in <module>\n  # </pre><script>alert(1)</script>\n"
	if err := os.WriteFile(culpritFile, []byte(dump), 0o644); err != nil {
		t.Fatal(err)
	}
	bystanderFile := func(local int) string {
		return filepath.Join(dir, "attempt_0", fmt.Sprint(local), stacksName)
	}
	user := func(local, rank int, file string) eventlog.RankStacksRank {
		return eventlog.RankStacksRank{LocalRank: local, Rank: rank, PID: 10 + rank, State: "dumped", Activity: "user", Place: "train.py:60 in <lambda>", File: file}
	}
	waiting := func(local, rank int) eventlog.RankStacksRank {
		return eventlog.RankStacksRank{LocalRank: local, Rank: rank, PID: 10 + rank, State: "dumped", Activity: "collective",
			Place: "train.py:88 in step", Collective: "all_reduce", File: bystanderFile(local)}
	}
	const (
		knownWhy  = "not waiting in a collective while the others wait in one"
		knownText = "rank 1 hung: in train.py:60 in <lambda>, not in a collective; ranks 0, 2-3: in all_reduce at train.py:88 in step"
		silentWhy = "nothing singles one rank out: the first rank to fall silent is named"
		aloneText = "rank 2 first silent: in all_reduce at train.py:88 in step; rank 3: in all_reduce at train.py:88 in step"
	)
	known := func(ranks ...eventlog.RankStacksRank) eventlog.RankStacksEvent {
		return eventlog.RankStacksEvent{Round: 0, Known: true, Culprits: []int{1}, Why: knownWhy, Text: knownText, TookMS: 12.5, Ranks: ranks}
	}
	n1Known := stacksLine(t, "n1", "20.010", known(waiting(0, 0), user(1, 1, culpritFile)))
	n2Known := stacksLine(t, "n2", "20.012", known(waiting(0, 2), waiting(1, 3)))
	n2Alone := stacksLine(t, "n2", "20.012", eventlog.RankStacksEvent{Round: 0, Known: false, Culprits: []int{2}, Why: silentWhy,
		Text: aloneText, TookMS: 500, Ranks: []eventlog.RankStacksRank{waiting(0, 2), waiting(1, 3)}})
	// GPU ranks with NCCL flight recorders: the bystanders wait in
	// all_reduce #57, the culprit's last one was #56.
	const pendingFR, lastFR = "in nccl:all_reduce #57 (group 0 default_pg) started", "none pending, the last nccl:all_reduce #56 (group 0 default_pg) completed"
	frFile := filepath.Join(dir, "attempt_0", "1", "flight_recorder.pkl")
	withFR := func(r eventlog.RankStacksRank, text, file string) eventlog.RankStacksRank {
		r.FlightRecorder, r.FlightRecorderText, r.FlightRecorderFile = "taken", text, file
		return r
	}
	n1FR := stacksLine(t, "n1", "20.010", known(withFR(waiting(0, 0), pendingFR, ""), withFR(user(1, 1, culpritFile), lastFR, frFile)))
	n2FR := stacksLine(t, "n2", "20.012", known(withFR(waiting(0, 2), pendingFR, ""), withFR(waiting(1, 3), pendingFR, "")))
	firstSilentText := "rank 0 first silent: in all_reduce at train.py:88 in step; rank 1: in all_reduce at train.py:88 in step"
	missing := filepath.Join(dir, "elsewhere", stacksName)
	n1FirstSilent := stacksLine(t, "n1", "20.010", eventlog.RankStacksEvent{Round: 0, Known: false, Culprits: []int{0}, Why: silentWhy,
		Text: firstSilentText, TookMS: 3, Ranks: []eventlog.RankStacksRank{
			{LocalRank: 0, Rank: 0, PID: 10, State: "dumped", Activity: "collective", Place: "train.py:88 in step", Collective: "all_reduce", File: missing},
			waiting(1, 1)}})

	tests := []struct {
		name     string
		logs     [][]string
		hang     bool // a Hang is reported for round 0
		known    bool
		culprits []int
		agree    bool
		findings int
		groups   []string // rankList: what
		judged   []int
		reason   string   // round 0's reason contains it
		html     []string // in the page
		notHTML  []string // not in the page
		culprit  string   // the lane with a culprit mark
	}{
		{
			name: "known culprit on a 2-node job",
			logs: [][]string{
				hangNodeLines("n1", 0, 4, n1Known, hangLine("n1", 1, 1, true, knownText)),
				hangNodeLines("n2", 1, 4, n2Known),
			},
			hang: true, known: true, culprits: []int{1}, agree: true, findings: 1, judged: []int{1},
			groups: []string{"rank 1: in train.py:60 in <lambda>, not in a collective", "ranks 0, 2-3: in all_reduce at train.py:88 in step"},
			reason: knownText,
			html: []string{
				"<h2>Hangs</h2>",
				"<b>rank 1 hung</b>: in train.py:60 in &lt;lambda&gt;, not in a collective · on n1 (local rank 1, pid 11)",
				"<li>ranks 0, 2-3: in all_reduce at train.py:88 in step</li>",
				"rank 1 killed on this finding, before its own clock ran out",
				"<code>" + culpritFile + "</code>",
				"<code>" + bystanderFile(0) + "</code>",
				`line 99 in &lt;module&gt;`,
				"&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;",
				"4 rank(s) on 2 node(s)",
			},
			notHTML: []string{"<script>", "first silent", "findings for this round differ"},
			culprit: "rank 1",
		},
		{
			name: "NCCL flight recorders",
			logs: [][]string{
				hangNodeLines("n1", 0, 4, n1FR, hangLine("n1", 1, 1, true, knownText)),
				hangNodeLines("n2", 1, 4, n2FR),
			},
			hang: true, known: true, culprits: []int{1}, agree: true, findings: 1, judged: []int{1},
			groups: []string{"rank 1: in train.py:60 in <lambda>, not in a collective; NCCL flight recorder: " + lastFR,
				"ranks 0, 2-3: in all_reduce at train.py:88 in step; NCCL flight recorder: " + pendingFR},
			reason: knownText,
			html: []string{
				"NCCL flight recorder of rank 1: <code>" + frFile + "</code>",
				"<li>ranks 0, 2-3: in all_reduce at train.py:88 in step; NCCL flight recorder: " + pendingFR + "</li>",
			},
			culprit: "rank 1",
		},
		{
			name: "unknown: the first silent rank is not called the one that hung",
			logs: [][]string{hangNodeLines("n1", 0, 2, n1FirstSilent, hangLine("n1", 0, 0, false, firstSilentText))},
			hang: true, known: false, culprits: []int{0}, agree: true, findings: 1,
			groups: []string{"rank 0: in all_reduce at train.py:88 in step", "rank 1: in all_reduce at train.py:88 in step"},
			reason: firstSilentText,
			html: []string{
				"<b>no rank singled out</b>; <b>rank 0 first silent</b>: (not necessarily the one that hung) in all_reduce at train.py:88 in step",
				"why: " + silentWhy,
				"<code>" + missing + "</code> (not on this machine",
			},
			notHTML: []string{"rank 0 hung", "findings for this round differ"},
			culprit: "rank 0",
		},
		{
			name: "two nodes disagree: n2 judged alone",
			logs: [][]string{
				hangNodeLines("n1", 0, 4, n1Known, hangLine("n1", 1, 1, true, knownText)),
				hangNodeLines("n2", 1, 4, n2Alone),
			},
			hang: true, known: true, culprits: []int{1}, agree: false, findings: 2, judged: []int{1},
			groups: []string{"rank 1: in train.py:60 in <lambda>, not in a collective", "ranks 0, 2-3: in all_reduce at train.py:88 in step"},
			reason: knownText + " (the nodes' findings differ: 2 findings, see Hangs)",
			html: []string{
				"<b>rank 1 hung</b>: in train.py:60 in &lt;lambda&gt;, not in a collective",
				"The nodes' findings for this round differ",
				"<tr><td>n1</td><td>hung: rank 1</td>",
				"<tr><td>n2</td><td>first silent: rank 2</td><td>" + aloneText + "</td>",
			},
			notHTML: []string{"<script>"},
			culprit: "rank 1",
		},
		{
			name:    "no rank_stacks: as before",
			logs:    [][]string{hangNodeLines("n1", 0, 4, hangLine("n1", 1, 1, false, "")), hangNodeLines("n2", 1, 4)},
			reason:  "rank 1 hung (heartbeat)",
			notHTML: []string{"<h2>Hangs</h2>", "culprit", "first silent"},
		},
		{
			// The rank_stacks record lost (a line that did not decode):
			// the rank_hang's finding still names the culprit.
			name:    "only rank_hang's finding",
			logs:    [][]string{hangNodeLines("n1", 0, 4, hangLine("n1", 1, 1, true, knownText)), hangNodeLines("n2", 1, 4)},
			reason:  knownText,
			notHTML: []string{"<h2>Hangs</h2>"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := buildFromLogs(t, tt.logs...)
			checkSum(t, r)
			if len(r.Rounds) != 2 || r.Rounds[0].End != "hang" {
				t.Fatalf("rounds %+v, want a hung round 0 and round 1", r.Rounds)
			}
			if got := r.Rounds[0].Reason; !strings.Contains(got, tt.reason) {
				t.Errorf("round 0's reason %q, want it to contain %q", got, tt.reason)
			}
			var js, page bytes.Buffer
			if err := r.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			if err := r.WriteHTML(&page); err != nil {
				t.Fatal(err)
			}
			html := page.String()
			for _, want := range tt.html {
				if !strings.Contains(html, want) {
					t.Errorf("the page lacks %q", want)
				}
			}
			for _, not := range tt.notHTML {
				if strings.Contains(html, not) {
					t.Errorf("the page has %q", not)
				}
			}
			var culpritLanes []string
			for _, l := range r.Ranks {
				for _, m := range l.Marks {
					if m.Kind == "culprit" {
						culpritLanes = append(culpritLanes, l.Name)
					}
				}
			}
			if !tt.hang {
				if r.Hangs != nil || strings.Contains(js.String(), `"hangs"`) || culpritLanes != nil {
					t.Errorf("hangs %+v, culprit marks on %v: want none without rank_stacks", r.Hangs, culpritLanes)
				}
				return
			}
			if len(r.Hangs) != 1 {
				t.Fatalf("hangs %+v, want one", r.Hangs)
			}
			h := r.Hangs[0]
			if h.Round != 0 || h.Known != tt.known || !slices.Equal(h.Culprits, tt.culprits) || h.Agree != tt.agree ||
				len(h.Findings) != tt.findings || !slices.Equal(h.Judged, tt.judged) {
				t.Errorf("hang round %d known %v culprits %v agree %v findings %d judged %v; want round 0, %v, %v, %v, %d, %v",
					h.Round, h.Known, h.Culprits, h.Agree, len(h.Findings), h.Judged, tt.known, tt.culprits, tt.agree, tt.findings, tt.judged)
			}
			var groups []string
			for _, g := range h.Groups {
				groups = append(groups, stacks.RankList(g.Ranks)+": "+g.What)
			}
			if !slices.Equal(groups, tt.groups) {
				t.Errorf("groups %q, want %q", groups, tt.groups)
			}
			for _, hr := range h.Ranks {
				if want := fmt.Sprintf("n%d", hr.Rank/2+1); hr.Node != want || hr.File == "" {
					t.Errorf("rank %d on %s with file %q, want on %s with its file", hr.Rank, hr.Node, hr.File, want)
				}
			}
			if !slices.Equal(culpritLanes, []string{tt.culprit}) {
				t.Errorf("culprit marks on %v, want on %s", culpritLanes, tt.culprit)
			}
			// The JSON holds the hang, each rank's node and file, and
			// reads back.
			var back struct {
				Hangs []Hang `json:"hangs"`
			}
			if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Hangs) != 1 || len(back.Hangs[0].Ranks) != len(h.Ranks) ||
				!slices.Equal(back.Hangs[0].Culprits, tt.culprits) || back.Hangs[0].Ranks[0].Node == "" {
				t.Errorf("the JSON's hangs %+v (%v), want the hang", back.Hangs, err)
			}
		})
	}
}

// TestReadStacks: only a regular file named stacks.txt that begins as the
// launcher writes it is read onto the page, and at most its first 64 KiB.
func TestReadStacks(t *testing.T) {
	dir := t.TempDir()
	good := stacksHeader + "local rank 0 (rank 4, pid 40), taken 2026-01-01T00:00:20Z before it or a peer was killed\n\nThread 0x1:\n  File \"train.py\", line 1 in <module>\n"
	write := func(rel, text string) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := filepath.Join(dir, "link", stacksName)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(write("secret.txt", good), link); err != nil {
		t.Fatal(err)
	}
	big := good + strings.Repeat("  File \"x.py\", line 1 in f\n", 4000)
	tests := []struct {
		name, path string
		text       string // Text has this prefix ("" = not read)
		truncated  bool
		note       string
	}{
		{"a stacks file", write("a/0/stacks.txt", good), good, false, ""},
		{"another rank's (the same path on another node)", write("e/0/stacks.txt", strings.Replace(good, "pid 40", "pid 41", 1)), "", false, "another rank's"},
		{"another name", write("a/0/other.txt", good), "", false, "not named stacks.txt"},
		{"no header", write("b/0/stacks.txt", "root:x:0:0\n"), "", false, "not a stacks file of ft-launcher"},
		{"a symbolic link", link, "", false, "not a regular file"},
		{"missing", filepath.Join(dir, "c", stacksName), "", false, "not on this machine"},
		{"large", write("d/0/stacks.txt", big), good, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := readStacks(eventlog.RankStacksRank{LocalRank: 0, Rank: 4, PID: 40, File: tt.path})
			if (tt.text == "") != (st.Text == "") || !strings.HasPrefix(st.Text, tt.text) || st.Truncated != tt.truncated || !strings.Contains(st.Note, tt.note) {
				t.Errorf("read %d bytes (truncated %v, note %q); want prefix %q, truncated %v, note %q", len(st.Text), st.Truncated, st.Note, tt.text, tt.truncated, tt.note)
			}
			if len(st.Text) > maxStacksBytes || (st.Truncated && !strings.HasSuffix(st.Text, "\n")) {
				t.Errorf("%d bytes shown, want at most %d and whole lines", len(st.Text), maxStacksBytes)
			}
		})
	}
}
