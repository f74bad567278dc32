package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// inProcessMetrics are the collectors of --restart-mode in-process.
type inProcessMetrics struct {
	restarts  *prometheus.CounterVec
	fallbacks *prometheus.CounterVec
	phases    *prometheus.HistogramVec
}

func newInProcessMetrics(reg *prometheus.Registry) *inProcessMetrics {
	ip := &inProcessMetrics{
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ftlauncher_restarts_by_mode_total",
			Help: "Restarts of this node's ranks by mode: full (every rank restarts) or in-process (the survivors stay)."},
			[]string{"mode"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ftlauncher_inprocess_fallbacks_total",
			Help: "In-process restarts that fell back to the full restart, by why (rejoin_timeout, failure_during, notice_failed)."},
			[]string{"why"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ftlauncher_inprocess_phase_seconds",
			Help:    "In-process restart phases per survivor: notice (failure seen -> notice sent), teardown, rejoin, restore, first_step.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"phase"}),
	}
	reg.MustRegister(ip.restarts, ip.fallbacks, ip.phases)
	return ip
}

// RestartedMode records a restart of this node's ranks with its mode
// ("full" or "in-process").
func (m *Metrics) RestartedMode(mode string) {
	if m == nil {
		return
	}
	m.ip.restarts.WithLabelValues(mode).Inc()
}

// InProcessFallback records an in-process restart that fell back to the
// full restart.
func (m *Metrics) InProcessFallback(why string) {
	if m == nil {
		return
	}
	m.ip.fallbacks.WithLabelValues(why).Inc()
}

// InProcessPhase records one phase of a survivor's in-process restart.
func (m *Metrics) InProcessPhase(phase string, d time.Duration) {
	if m == nil || d <= 0 {
		return
	}
	m.ip.phases.WithLabelValues(phase).Observe(d.Seconds())
}
