package report

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/stacks"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("report: encode JSON: %w", err)
	}
	return nil
}

// Geometry of the timeline, in SVG user units.
const (
	svgWidth = 1300
	labelW   = 170
	plotW    = svgWidth - labelW - 20
	laneH    = 22
	axisH    = 28
	headingH = 24
	barInset = 4
	markSize = 5
)

// colors of spans, marks and phases (one palette; also the legend).
var colors = map[string]string{
	"running": "#4c9f70", "spare": "#9db4d8", "filler": "#b48ad8", "stopping": "#c05050",
	Productive: "#4c9f70", Recompute: "#e07b39", Detection: "#c03030", Stop: "#8a3a3a", Rendezvous: "#5878b8",
	Startup: "#e0b040", Queue: "#999999", Shutdown: "#bbbbbb",
	"crash": "#d01010", "hang": "#a000c0", "node_loss": "#000000", "swap": "#0070e0", "filler_reclaim": "#b48ad8",
	"restart": "#ff8c00", "checkpoint": "#1060c0", "first_step": "#00a0a0", "restore": "#e0409a", "exit": "#606060", "round_ended": "#805000",
	"standby": "#9db4d8", "condition": "#444444", "stacks": "#7a86b8", "culprit": "#ff0066",
	"speed_ok": "#a8d5b5", "speed_lagging": "#f0c040", "speed_slow": "#e05050", "speed_unjudged": "#dddddd", "straggler": "#ff0066",
}

type svgRect struct {
	X, Y, W, H         float64
	Fill, Title, Class string
}

type svgMark struct {
	X, Y       float64
	Fill, Kind string
	Title      string
}

type svgText struct {
	X, Y        float64
	Text, Class string
}

type page struct {
	R          *Report
	Height     float64
	Width      int
	Rects      []svgRect
	Marks      []svgMark
	Texts      []svgText
	Lines      []svgRect // grid lines (W=0)
	Phases     []phaseRow
	Categories []categoryRow
	CatBar     []svgRect // the categories as one stacked bar
	CatBarW    int
	CatBarH    int
	Legend     []legendItem
	Hangs      []hangView
	Start, End string
}

// categoryRow is one row of the badput-categories table; Seconds is nil
// where the records measured none of the category.
type categoryRow struct {
	Name, Google, Color, From, CountedIn string
	Seconds                              *float64
	Share                                float64
}

type phaseRow struct {
	Name, Color, Meaning string
	Seconds, Share       float64
}

type legendItem struct{ Name, Color string }

// phaseMeaning is the table's explanation of each phase (docs/report.md
// has the long form).
var phaseMeaning = map[string]string{
	Productive: "training that was kept: from every rank's first heartbeat to the fault, or to the last checkpoint before it",
	Recompute:  "steps done after the last checkpoint of a failed round: lost, done again after the restart",
	Detection:  "from the fault (a hung rank's last progress, a crash) to the launcher knowing it",
	Stop:       "stopping the round's remaining ranks",
	Rendezvous: "launcher start and waiting for each round's nodes",
	Startup:    "ranks started until every rank's first heartbeat (imports, process group, checkpoint restore)",
	Queue:      "between the jobs of a Slurm chain (the scheduler's queue)",
	Shutdown:   "after the last ranks exited until the launchers exited",
}

// WriteHTML writes the report as one self-contained HTML page: inline CSS
// and SVG, no script, no external resource.
func (r *Report) WriteHTML(w io.Writer) error {
	p := &page{R: r, Width: svgWidth, CatBarW: catBarW, CatBarH: catBarH, Start: r.Start.Format(time.RFC3339), End: r.End.Format(time.RFC3339)}
	wall := r.End.Sub(r.Start)
	x := func(t time.Time) float64 {
		if wall <= 0 {
			return labelW
		}
		return labelW + float64(t.Sub(r.Start))/float64(wall)*plotW
	}
	y := float64(axisH)
	// Axis: ticks every ~1/10 of the wall time, rounded.
	step := niceStep(wall / 10)
	for t := time.Duration(0); t <= wall && step > 0; t += step {
		xt := x(r.Start.Add(t))
		p.Lines = append(p.Lines, svgRect{X: xt, Y: axisH - 6})
		p.Texts = append(p.Texts, svgText{X: xt, Y: axisH - 10, Text: fmtDur(t), Class: "tick"})
	}
	heading := func(s string) {
		y += headingH
		p.Texts = append(p.Texts, svgText{X: 4, Y: y - 6, Text: s, Class: "heading"})
	}
	lane := func(l Lane, class string) {
		p.Texts = append(p.Texts, svgText{X: 8, Y: y + laneH - 7, Text: l.Name, Class: "lane-label"})
		p.Rects = append(p.Rects, svgRect{X: labelW, Y: y, W: plotW, H: laneH, Fill: "#f4f4f4", Class: class, Title: l.Name})
		for _, s := range l.Spans {
			x0, x1 := x(s.Start), x(s.End)
			p.Rects = append(p.Rects, svgRect{X: x0, Y: y + barInset, W: max(x1-x0, 1), H: laneH - 2*barInset, Fill: colors[s.Kind],
				Class: "span " + s.Kind, Title: fmt.Sprintf("%s %s: %s → %s (%s)", l.Name, s.Label, s.Start.Format("15:04:05.000"), s.End.Format("15:04:05.000"), fmtDur(s.End.Sub(s.Start)))})
		}
		for _, m := range l.Marks {
			p.Marks = append(p.Marks, svgMark{X: x(m.At), Y: y + laneH/2, Fill: colors[m.Kind], Kind: m.Kind,
				Title: fmt.Sprintf("%s %s at %s: %s", l.Name, m.Kind, m.At.Format("15:04:05.000"), m.Label)})
		}
		y += laneH + 2
	}
	// The job's phases as one lane.
	heading("Phases (goodput account)")
	phaseLane := Lane{Name: "job"}
	for _, rd := range r.Rounds {
		cur := rd.Start
		for _, ph := range []string{Startup, Productive, Recompute, Detection, Stop} {
			d := time.Duration(rd.PhasesS[ph] * float64(time.Second))
			if d > 0 {
				phaseLane.Spans = append(phaseLane.Spans, Span{Kind: ph, Start: cur, End: cur.Add(d), Label: fmt.Sprintf("round %d %s", rd.Round, ph)})
			}
			cur = cur.Add(d)
		}
	}
	for _, rs := range r.Restarts {
		phaseLane.Marks = append(phaseLane.Marks, Mark{Kind: "restart", At: rs.At, Label: fmt.Sprintf("after round %d: %s", rs.AfterRound, rs.Reason)})
	}
	for _, h := range r.Hangs {
		phaseLane.Marks = append(phaseLane.Marks, Mark{Kind: "culprit", At: h.At, Label: fmt.Sprintf("round %d hang: %s", h.Round, h.Text)})
	}
	lane(phaseLane, "lane-phase")
	heading("Nodes")
	for _, l := range r.Nodes {
		lane(l, "lane-node")
	}
	heading("Ranks")
	for _, l := range r.Ranks {
		lane(l, "lane-rank")
	}
	if len(r.Speeds) > 0 {
		heading("Speed (each node against the others: green >= 0.9, yellow 0.8-0.9, red < 0.8)")
		for _, l := range speedLanes(r.Speeds) {
			lane(l, "lane-speed")
		}
	}
	if r.Workload != nil {
		heading("AppWrapper " + r.Workload.Name)
		lane(Lane{Name: fmt.Sprintf("%s (%d resets)", r.Workload.Phase, r.Workload.Resets), Marks: r.Workload.Conditions}, "lane-workload")
	}
	p.Height = y + 10
	for _, ph := range PhaseOrder {
		s := r.PhasesS[ph]
		share := 0.0
		if r.WallS > 0 {
			share = s / r.WallS * 100
		}
		p.Phases = append(p.Phases, phaseRow{Name: ph, Color: colors[ph], Meaning: phaseMeaning[ph], Seconds: s, Share: share})
	}
	p.Categories, p.CatBar = categoryRows(r)
	legend := []string{"running", "startup", "spare", "filler", "crash", "hang", "node_loss", "swap", "filler_reclaim", "restart", "checkpoint", "restore", "first_step", "exit", "round_ended", "standby"}
	if len(r.Hangs) > 0 {
		legend = append(legend, "culprit", "stacks")
	}
	if len(r.Speeds) > 0 {
		legend = append(legend, "speed_ok", "speed_lagging", "speed_slow", "straggler")
	}
	for _, k := range legend {
		p.Legend = append(p.Legend, legendItem{Name: k, Color: colors[k]})
	}
	p.Hangs = hangViews(r)
	if err := pageTmpl.Execute(w, p); err != nil {
		return fmt.Errorf("report: render HTML: %w", err)
	}
	return nil
}

// Geometry of the categories' bar.
const (
	catBarW = 600
	catBarH = 16
)

// categoryRows are the badput-categories table (productive first) and its
// bar, whose segments are the measured categories in the table's order.
func categoryRows(r *Report) ([]categoryRow, []svgRect) {
	c := r.Categories
	prod := c.ProductiveS
	rows := []categoryRow{{Name: Productive, Google: "goodput (productive step time)", Color: colors[Productive], Seconds: &prod,
		From: "productive, less the checkpoint saves and restores recorded inside it"}}
	for _, cat := range CategoryOrder {
		google, color, from := categoryMeaning(cat)
		rows = append(rows, categoryRow{Name: cat, Google: google, Color: color, From: from, CountedIn: c.CountedIn[cat], Seconds: c.BadputS[cat]})
	}
	var bar []svgRect
	x := 0.0
	for i := range rows {
		if rows[i].Seconds == nil || r.WallS <= 0 {
			continue
		}
		rows[i].Share = *rows[i].Seconds / r.WallS * 100
		w := *rows[i].Seconds / r.WallS * catBarW
		if w > 0 {
			bar = append(bar, svgRect{X: x, W: w, H: catBarH, Fill: rows[i].Color,
				Title: fmt.Sprintf("%s: %.3f s (%.1f%%)", rows[i].Name, *rows[i].Seconds, rows[i].Share)})
		}
		x += w
	}
	return rows, bar
}

// categoryMeaning is a category's name in ml-goodput-measurement
// (BadputType), its colour, and the phases it is made of (docs/report.md,
// "Badput in the field's categories", has the rule).
func categoryMeaning(cat string) (google, color, from string) {
	switch cat {
	case CatStartup:
		return "TPU_INITIALIZATION + TRAINING_PREP + PROGRAM_STARTUP", colors[Startup], "startup of every round, less the restores and saves recorded in it"
	case CatRestore:
		return "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME", colors["restore"], "while any rank of a round was in state.load() (state_restore), inside startup or productive"
	case CatSave:
		return "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME", colors["checkpoint"], "while any rank of a round was in a 'checkpointing' section (rank_checkpoint), inside startup or productive"
	case CatDataLoading:
		return "DATA_LOADING_SYNC", "#999999", "not in the records: the ranks do not report waiting for data"
	case CatWasted:
		return "WASTED_PROGRESS_FROM_DISRUPTION", colors[Recompute], "recompute"
	case CatDisruption:
		return "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", colors[Detection], "detection and stop of failed rounds, rendezvous of the rounds after them, a chain's queue between jobs and a later job's launcher start"
	}
	return "OTHER", colors[Shutdown], "the launcher's start, the queue before a chain's first job, the end of a successful round, shutdown"
}

// hangView is one hang as the page shows it: the verdict first, then why,
// the culprits' stacks, the bystanders grouped, and every rank's file.
type hangView struct {
	Title    string
	Verdicts []verdictLine
	Why      string
	Judged   string // the ranks killed on the finding before their clocks ran out
	Culprits []HangRank
	Others   []string // "ranks 0, 2-3: in all_reduce at train.py:88 in step"
	Findings []findingRow
	Disagree bool
	Ranks    []HangRank
	Nodes    int
	Known    bool
}

// verdictLine is one culprit: "rank 1 hung: in ... · on n1 (...)"; Lead
// says first that nothing singled a rank out, when so.
type verdictLine struct{ Lead, Head, What, Where string }

// findingRow is one node's finding, when the nodes' differ.
type findingRow struct{ Nodes, Verdict, Text, Why string }

func hangViews(r *Report) []hangView {
	var out []hangView
	for _, h := range r.Hangs {
		v := hangView{Title: fmt.Sprintf("Round %d", h.Round), Why: h.Why, Ranks: h.Ranks, Disagree: !h.Agree, Known: h.Known}
		if h.Job != "" {
			v.Title += " of job " + h.Job
		}
		nodes := map[string]bool{}
		for _, hr := range h.Ranks {
			nodes[hr.Node] = true
			if hr.Culprit {
				v.Culprits = append(v.Culprits, hr)
			}
		}
		v.Nodes = len(nodes)
		v.Title += fmt.Sprintf(": stacks taken at %s, judged in %.0f ms, %d rank(s) on %d node(s)", h.At.Format("15:04:05.000"), h.TookMS, len(h.Ranks), len(nodes))
		for _, g := range h.Groups {
			if !g.Culprit {
				v.Others = append(v.Others, stacks.RankList(g.Ranks)+": "+g.What)
				continue
			}
			l := verdictLine{Head: stacks.RankList(g.Ranks) + " hung", What: g.What}
			if !h.Known {
				l.Head = stacks.RankList(g.Ranks) + " first silent"
				l.What = "(not necessarily the one that hung) " + g.What
				if len(v.Verdicts) == 0 {
					l.Lead = "no rank singled out"
				}
			}
			for _, hr := range h.Ranks {
				if hr.Culprit && slices.Contains(g.Ranks, hr.Rank) {
					l.Where = fmt.Sprintf("on %s (local rank %d, pid %d)", hr.Node, hr.LocalRank, hr.PID)
				}
			}
			v.Verdicts = append(v.Verdicts, l)
		}
		if len(v.Verdicts) == 0 { // a finding that named no rank (no ranks answered)
			v.Verdicts = append(v.Verdicts, verdictLine{Lead: "no rank named", What: h.Text})
		}
		if len(h.Judged) > 0 {
			v.Judged = stacks.RankList(h.Judged) + " killed on this finding, before its own clock ran out"
		}
		if !h.Agree {
			for _, f := range h.Findings {
				verdict := "first silent: " + stacks.RankList(f.Culprits)
				if f.Known {
					verdict = "hung: " + stacks.RankList(f.Culprits)
				}
				if len(f.Culprits) == 0 {
					verdict = "no rank named"
				}
				v.Findings = append(v.Findings, findingRow{Nodes: strings.Join(f.Nodes, ", "), Verdict: verdict, Text: f.Text, Why: f.Why})
			}
		}
		out = append(out, v)
	}
	return out
}

func niceStep(d time.Duration) time.Duration {
	for _, s := range []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
		10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour} {
		if s >= d {
			return s
		}
	}
	return 24 * time.Hour
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

var pageTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"f1":  func(f float64) string { return fmt.Sprintf("%.1f", f) },
	"f3":  func(f float64) string { return fmt.Sprintf("%.3f", f) },
	"pct": func(f float64) string { return fmt.Sprintf("%.1f%%", f*100) },
	"ts": func(v any) string {
		switch t := v.(type) {
		case time.Time:
			return t.Format("15:04:05.000")
		case *time.Time:
			if t != nil {
				return t.Format("15:04:05.000")
			}
		}
		return ""
	},
	"add":  func(a, b float64) float64 { return a + b },
	"addi": func(a, b int) int { return a + b },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>ft-launcher run report {{range .R.RunIDs}}{{.}} {{end}}</title>
<style>
body { font-family: sans-serif; margin: 16px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px 0; }
h2 { font-size: 16px; margin: 18px 0 6px 0; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: middle; }
.summary { font-size: 14px; margin: 4px 0 8px 0; }
.legend span.item { margin-right: 12px; font-size: 12px; }
svg text { font-size: 11px; }
svg text.heading { font-size: 12px; font-weight: bold; }
svg text.tick { text-anchor: middle; fill: #555; }
.note { font-size: 13px; color: #444; }
table.categories td:first-child { white-space: nowrap; }
.warn { font-size: 13px; color: #a00000; }
h3 { font-size: 14px; margin: 10px 0 4px 0; }
.verdict { font-size: 15px; margin: 4px 0; }
.verdict b { color: #b00040; }
pre.stacks { font-size: 12px; background: #f6f6f6; padding: 6px; overflow-x: auto; max-height: 40em; }
details { margin: 4px 0; font-size: 13px; }
ul.others { font-size: 14px; margin: 4px 0; }
</style>
</head>
<body>
<h1>Run report: {{range .R.RunIDs}}{{.}} {{end}}</h1>
<div class="summary">{{.Start}} → {{.End}} · wall {{f1 .R.WallS}} s · <b>goodput {{pct .R.Goodput}}</b> · {{len .R.Rounds}} round(s), {{len .R.Restarts}} restart(s){{if gt (len .R.Jobs) 1}}, {{len .R.Jobs}} jobs{{end}}</div>
{{range .R.Warnings}}<div class="warn">warning: {{.}}</div>{{end}}
{{if .Hangs}}<h2>Hangs</h2>
<p class="note">Which rank hung, from the Python stacks of every rank, taken when a rank's timeout expired and before any rank was killed (rank_stacks). The first timeout to expire is often a bystander's: ranks waiting in a collective for a hung peer fall silent with it.</p>
{{range .Hangs}}<div class="hang">
<h3>{{.Title}}</h3>
{{range .Verdicts}}<p class="verdict">{{if .Lead}}<b>{{.Lead}}</b>; {{end}}{{if .Head}}<b>{{.Head}}</b>: {{end}}{{.What}}{{if .Where}} · {{.Where}}{{end}}</p>
{{end}}{{if .Why}}<p class="note">why: {{.Why}}{{if .Judged}} · {{.Judged}}{{end}}</p>
{{else if .Judged}}<p class="note">{{.Judged}}</p>
{{end}}{{range .Culprits}}{{if .File}}<div class="note">stacks of rank {{.Rank}}: <code>{{.File}}</code>{{with .Stacks}}{{if not .Text}} ({{.Note}}){{end}}{{end}}</div>
{{with .Stacks}}{{if .Text}}<details><summary>its stacks ({{.Size}} bytes{{if .Truncated}}, the first 64 KiB shown{{end}})</summary><pre class="stacks">{{.Text}}</pre></details>
{{end}}{{end}}{{end}}{{if .FlightRecorderFile}}<div class="note">NCCL flight recorder of rank {{.Rank}}: <code>{{.FlightRecorderFile}}</code> (torch's pickle, for torch's <code>fr_trace</code>)</div>
{{end}}{{end}}{{if .Others}}<ul class="others">
{{range .Others}}<li>{{.}}</li>
{{end}}</ul>
{{end}}{{if .Disagree}}<div class="warn">The nodes' findings for this round differ: each is below. The verdict above is the first: a finding on evidence before a first-silent guess, then the one more nodes made. A node that judged alone (the exchange of stacks did not complete in time) saw only its own ranks.</div>
<table class="findings">
<tr><th>nodes</th><th>verdict</th><th>finding</th><th>why</th></tr>
{{range .Findings}}<tr><td>{{.Nodes}}</td><td>{{.Verdict}}</td><td>{{.Text}}</td><td>{{.Why}}</td></tr>
{{end}}</table>
{{end}}{{$known := .Known}}<details><summary>every rank's stacks file ({{len .Ranks}} rank(s) on {{.Nodes}} node(s))</summary>
<table class="hang-ranks">
<tr><th>rank</th><th>named</th><th>node</th><th>local rank</th><th>pid</th><th>state</th><th>activity</th><th>where</th><th>collective</th><th>stacks file (on its node)</th></tr>
{{range .Ranks}}<tr><td class="num">{{.Rank}}</td><td>{{if .Culprit}}{{if $known}}hung{{else}}first silent{{end}}{{end}}</td><td>{{.Node}}</td><td class="num">{{.LocalRank}}</td><td class="num">{{.PID}}</td><td>{{.State}}</td><td>{{.Activity}}</td><td>{{.Place}}</td><td>{{.Collective}}</td><td><code>{{.File}}</code></td></tr>
{{end}}</table>
</details>
</div>
{{end}}{{end}}<h2>Timeline</h2>
<div class="legend">{{range .Legend}}<span class="item"><span class="swatch" style="background: {{.Color}}"></span>{{.Name}}</span>{{end}}</div>
<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img" aria-label="timeline">
{{range .Lines}}<line x1="{{.X}}" y1="{{.Y}}" x2="{{.X}}" y2="{{$.Height}}" stroke="#e0e0e0" stroke-width="1"/>
{{end}}{{range .Texts}}<text x="{{.X}}" y="{{.Y}}" class="{{.Class}}">{{.Text}}</text>
{{end}}{{range .Rects}}<rect x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Fill}}" class="{{.Class}}"><title>{{.Title}}</title></rect>
{{end}}{{range .Marks}}<circle cx="{{.X}}" cy="{{.Y}}" r="5" fill="{{.Fill}}" stroke="#fff" stroke-width="1" class="mark {{.Kind}}"><title>{{.Title}}</title></circle>
{{end}}</svg>
<h2>Goodput</h2>
<table>
<tr><th>phase</th><th>seconds</th><th>share of wall time</th><th>what it is</th></tr>
{{range .Phases}}<tr><td><span class="swatch" style="background: {{.Color}}"></span>{{.Name}}</td><td class="num">{{f3 .Seconds}}</td><td class="num">{{f1 .Share}}%</td><td>{{.Meaning}}</td></tr>
{{end}}<tr><th>wall time</th><th class="num">{{f3 .R.WallS}}</th><th class="num">100%</th><th>the phases add up to it</th></tr>
</table>
{{range .R.Notes}}<p class="note">note: {{.}}</p>{{end}}
<h2>Badput in ml-goodput-measurement's categories</h2>
<svg xmlns="http://www.w3.org/2000/svg" width="{{.CatBarW}}" height="{{.CatBarH}}" viewBox="0 0 {{.CatBarW}} {{.CatBarH}}" role="img" aria-label="badput categories" class="categories-bar">
{{range .CatBar}}<rect x="{{.X}}" y="0" width="{{.W}}" height="{{.H}}" fill="{{.Fill}}"><title>{{.Title}}</title></rect>
{{end}}</svg>
<table class="categories">
<tr><th>category</th><th>ml-goodput-measurement</th><th>seconds</th><th>share of wall time</th><th>from the phases</th></tr>
{{range .Categories}}<tr><td><span class="swatch" style="background: {{.Color}}"></span>{{.Name}}</td><td>{{.Google}}</td><td class="num">{{if .Seconds}}{{f3 .Seconds}}{{else}}unknown{{end}}</td><td class="num">{{if .Seconds}}{{f1 .Share}}%{{end}}</td><td>{{.From}}{{if .CountedIn}}; {{if .Seconds}}more{{else}}its time{{end}} not measured: counted as {{.CountedIn}}{{end}}</td></tr>
{{end}}<tr><th>wall time</th><th></th><th class="num">{{f3 .R.WallS}}</th><th class="num">100%</th><th>productive and the measured categories add up to it · goodput {{pct .R.Categories.Goodput}}</th></tr>
</table>
{{range .R.Categories.Notes}}<p class="note">note: {{.}}</p>{{end}}
<h2>Rounds</h2>
<table>
<tr><th>job</th><th>round</th><th>start</th><th>ready</th><th>end</th><th>reason</th><th>steps lost</th><th>restored from</th><th>productive s</th><th>badput s</th></tr>
{{range .R.Rounds}}<tr><td>{{.Job}}</td><td class="num">{{.Round}}</td><td>{{ts .Start}}</td><td>{{if .Ready}}{{ts .Ready}}{{end}}</td><td>{{.End}}</td><td>{{.Reason}}</td><td class="num">{{if .StepsLost}}{{.StepsLost}}{{end}}</td><td>{{.RestoreSources}}</td><td class="num">{{f3 (index .PhasesS "productive")}}</td><td class="num">{{f3 (add (add (index .PhasesS "startup") (index .PhasesS "recompute")) (add (index .PhasesS "detection") (add (index .PhasesS "stop") (index .PhasesS "rendezvous"))))}}</td></tr>
{{end}}</table>
{{with .R.State}}<h2>Launcher-held state</h2>
<table class="state">
<tr><th>saves into launcher memory</th><td class="num">{{.Saves}}</td><td>training-loop stall per save: median {{f3 .SaveStallMedianMS}} ms, max {{f3 .SaveStallMaxMS}} ms; largest state {{.SaveBytesMax}} bytes</td></tr>
<tr><th>written out in the background</th><td class="num">{{.Written}}</td><td>{{range $k, $v := .WrittenBy}}{{$k}} ×{{$v}} {{end}}{{if .Written}}· slowest {{f3 .WriteMSMax}} ms{{end}}{{with .LastWritten}} · newest: step {{.Step}} ({{.File}}){{end}}</td></tr>
<tr><th>write-outs failed</th><td class="num">{{.WriteFailed}}</td><td>{{range .WriteErrors}}<div class="warn">{{.}}</div>{{end}}</td></tr>
<tr><th>restores</th><td class="num">{{$n := 0}}{{range .Restores}}{{$n = addi $n .}}{{end}}{{$n}}</td><td>{{range $k, $v := .Restores}}{{$k}} ×{{$v}} {{end}}{{if .EmptyLoads}}· {{.EmptyLoads}} load(s) found no state{{end}}</td></tr>
</table>{{end}}
<h2>Restarts</h2>
<table>
<tr><th>job</th><th>after round</th><th>at</th><th>action</th><th>reason</th></tr>
{{range .R.Restarts}}<tr><td>{{.Job}}</td><td class="num">{{.AfterRound}}</td><td>{{ts .At}}</td><td>{{.Action}}</td><td>{{.Reason}}</td></tr>
{{end}}</table>
{{if .R.Ledger}}<h2>Ledger</h2>
<table>
<tr><th>node</th><th>role</th><th>group rank</th><th>start</th><th>end</th><th>reason</th><th>detail</th></tr>
{{range .R.Ledger}}<tr><td>{{.Node}}</td><td>{{.Role}}</td><td class="num">{{.GroupRank}}</td><td>{{ts .Start}}</td><td>{{if .End}}{{ts .End}}{{end}}</td><td>{{.Reason}}</td><td>{{.Detail}}</td></tr>
{{end}}</table>{{end}}
<p class="note">Made by ft-resumer report from the launchers' records (docs/report.md explains every number). This page loads nothing from the network.</p>
</body>
</html>
`))
