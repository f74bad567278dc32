package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// stragglerMetrics are the collectors of the ranks' measured speed
// (package straggler; docs/stragglers.md).
type stragglerMetrics struct {
	rankSpeed  *prometheus.GaugeVec
	rankBusy   *prometheus.GaugeVec
	nodeSpeed  *prometheus.GaugeVec // no labels: this node
	stragglers *prometheus.CounterVec
}

func newStragglerMetrics(reg *prometheus.Registry) *stragglerMetrics {
	s := &stragglerMetrics{
		rankSpeed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ftlauncher_rank_relative_speed",
			Help: "Each of this node's ranks' speed relative to the other nodes' ranks (1: the same pace; 0.7: it needs 1/0.7 of their time for the same work), from the latest job-wide judgement."},
			[]string{"rank", "local_rank"}),
		rankBusy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ftlauncher_rank_busy_ratio",
			Help: "Share of wall time each of this node's ranks' process group demanded a CPU (running or waiting to run) over the latest sample; a rank that waits for its peers demands nothing."},
			[]string{"rank", "local_rank"}),
		nodeSpeed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ftlauncher_node_relative_speed",
			Help: "This node's speed relative to the other nodes (its slowest rank's)."}, nil),
		stragglers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ftlauncher_straggler_total",
			Help: "Times this node was found a straggler, by what was done (reported, swapped, kept: no spare stood by)."}, []string{"action"}),
	}
	reg.MustRegister(s.rankSpeed, s.rankBusy, s.nodeSpeed, s.stragglers)
	return s
}

// RankSpeed records one of this node's ranks' busy share and relative
// speed (speed < 0: not judged).
func (m *Metrics) RankSpeed(rank, localRank int, busy, speed float64) {
	if m == nil {
		return
	}
	r, lr := strconv.Itoa(rank), strconv.Itoa(localRank)
	m.st.rankBusy.WithLabelValues(r, lr).Set(busy)
	if speed >= 0 {
		m.st.rankSpeed.WithLabelValues(r, lr).Set(speed)
	}
}

// NodeSpeed records this node's relative speed.
func (m *Metrics) NodeSpeed(speed float64) {
	if m == nil {
		return
	}
	m.st.nodeSpeed.WithLabelValues().Set(speed)
}

// Straggler records that this node was found a straggler and what was
// done about it.
func (m *Metrics) Straggler(action string) {
	if m == nil {
		return
	}
	m.st.stragglers.WithLabelValues(action).Inc()
}
