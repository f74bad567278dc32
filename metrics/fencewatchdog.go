package metrics

import "github.com/prometheus/client_golang/prometheus"

// fenceWatchdogMetrics are the collectors of the fence watchdog a
// multi-node launcher runs beside its ranks (docs/rendezvous.md).
type fenceWatchdogMetrics struct {
	up       *prometheus.GaugeVec // no labels: absent until a watchdog started (single-node jobs run none)
	restarts prometheus.Counter
}

func newFenceWatchdogMetrics(reg *prometheus.Registry) *fenceWatchdogMetrics {
	fw := &fenceWatchdogMetrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ftlauncher_fence_watchdog_up",
			Help: "1 while the fence watchdog protects this node's ranks (a multi-node launcher; a dead one is restarted within milliseconds), 0 once it could not be restarted."}, nil),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ftlauncher_fence_watchdog_restarts_total",
			Help: "Deaths of the fence watchdog after which the launcher started a new one."}),
	}
	reg.MustRegister(fw.up, fw.restarts)
	return fw
}

// FenceWatchdogUp records whether the fence watchdog runs.
func (m *Metrics) FenceWatchdogUp(up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.fw.up.WithLabelValues().Set(v)
}

// FenceWatchdogRestarted records a restart of the fence watchdog.
func (m *Metrics) FenceWatchdogRestarted() {
	if m == nil {
		return
	}
	m.fw.restarts.Inc()
	m.fw.up.WithLabelValues().Set(1)
}
