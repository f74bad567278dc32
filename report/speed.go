package report

import (
	"sort"
	"strconv"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// NodeSpeeds is one node's measured speed over the run (rank_speed and
// straggler events; docs/stragglers.md).
type NodeSpeeds struct {
	Node       string         `json:"node"`
	Samples    []SpeedSample  `json:"samples"`
	Stragglers []StragglerAct `json:"stragglers,omitempty"`
}

// SpeedSample is one interval's judgement of a node: its speed relative
// to the other nodes (-1: not judged) and its ranks'.
type SpeedSample struct {
	At       time.Time                 `json:"at"`
	WindowS  float64                   `json:"window_s"`
	Speed    float64                   `json:"speed"`
	SlowForS float64                   `json:"slow_for_s,omitempty"`
	Ranks    []eventlog.RankSpeedEntry `json:"ranks"`
}

// StragglerAct is a straggler finding and what was done.
type StragglerAct struct {
	At       time.Time `json:"at"`
	Round    int       `json:"round"`
	Speed    float64   `json:"speed"`
	SlowForS float64   `json:"slow_for_s"`
	Action   string    `json:"action"`
	Why      string    `json:"why,omitempty"`
}

// speeds gathers every node's speed samples and straggler findings.
func speeds(rec *records) []NodeSpeeds {
	by := map[string]*NodeSpeeds{}
	get := func(node string) *NodeSpeeds {
		n, ok := by[node]
		if !ok {
			n = &NodeSpeeds{Node: node}
			by[node] = n
		}
		return n
	}
	for _, e := range rec.events {
		switch ev := e.Rec.(type) {
		case eventlog.RankSpeedEvent:
			n := get(e.Node)
			n.Samples = append(n.Samples, SpeedSample{At: e.TS, WindowS: ev.WindowS, Speed: ev.NodeSpeed, SlowForS: ev.SlowForS, Ranks: ev.Ranks})
		case eventlog.StragglerEvent:
			n := get(e.Node)
			n.Stragglers = append(n.Stragglers, StragglerAct{At: e.TS, Round: ev.Round, Speed: ev.Speed, SlowForS: ev.SlowForS, Action: ev.Action, Why: ev.Why})
		}
	}
	out := make([]NodeSpeeds, 0, len(by))
	for _, n := range by {
		sort.Slice(n.Samples, func(a, b int) bool { return n.Samples[a].At.Before(n.Samples[b].At) })
		out = append(out, *n)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Node < out[b].Node })
	return out
}

// speedKind is a sample's span kind in the timeline: how far below the
// others the node worked.
func speedKind(s float64) string {
	switch {
	case s < 0:
		return "speed_unjudged"
	case s < 0.8:
		return "speed_slow"
	case s < 0.9:
		return "speed_lagging"
	}
	return "speed_ok"
}

// speedLanes are the timeline's lanes of the nodes' speed.
func speedLanes(ns []NodeSpeeds) []Lane {
	var out []Lane
	for _, n := range ns {
		l := Lane{Name: n.Node}
		for _, s := range n.Samples {
			from := s.At.Add(-time.Duration(s.WindowS * float64(time.Second)))
			label := "not judged"
			if s.Speed >= 0 {
				label = "speed " + ftoa2(s.Speed)
			}
			l.Spans = append(l.Spans, Span{Kind: speedKind(s.Speed), Start: from, End: s.At, Label: label})
		}
		for _, a := range n.Stragglers {
			l.Marks = append(l.Marks, Mark{Kind: "straggler", At: a.At, Label: a.Action + " (speed " + ftoa2(a.Speed) + "): " + a.Why})
		}
		out = append(out, l)
	}
	return out
}

func ftoa2(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) }
