package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// leaseMetrics are the collectors of this node's rendezvous lease: how long
// etcd takes to answer its renewals, and how close each renewal came to the
// fence (docs/rendezvous.md, "Fencing"). At thousands of nodes an
// overloaded etcd shows here first: the answers slow down and the headroom
// shrinks before any node is fenced.
type leaseMetrics struct {
	rtt      prometheus.Histogram
	headroom prometheus.Histogram
	failures *prometheus.CounterVec
}

func newLeaseMetrics(reg *prometheus.Registry) *leaseMetrics {
	lm := &leaseMetrics{
		rtt: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ftlauncher_lease_renewal_seconds",
			Help:    "Time from sending a renewal of this node's rendezvous lease to etcd's answer (renewals answered with the lease alive).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}), // 1 ms .. 8 s
		headroom: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ftlauncher_lease_fence_headroom_seconds",
			Help: "At each renewal that moved the lease's proven validity forward: how long before the fence deadline of the previous proof " +
				"its answer came (0: after it, the node had fenced). Normally lease_ttl minus lease_ttl/3 minus the fence margin (2.8 s at the defaults).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 10)}), // 50 ms .. 25.6 s
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ftlauncher_lease_renewal_failures_total",
			Help: "Renewals of this node's rendezvous lease that failed, by reason: timeout (not answered within lease_ttl/2), " +
				"stream_ended (the keep-alive stream broke), unreachable (etcd did not take it), expired (etcd no longer knew the lease)."},
			[]string{"reason"}),
	}
	// Every reason at 0 from the start, so that a rate over it is defined
	// before the first failure.
	for _, r := range []string{"timeout", "stream_ended", "unreachable", "expired"} {
		lm.failures.WithLabelValues(r)
	}
	reg.MustRegister(lm.rtt, lm.headroom, lm.failures)
	return lm
}

// LeaseRenewed records a renewal of the rendezvous lease answered after
// rtt. moved says whether it proved the lease valid for longer than before;
// then headroom is how long before the previous proof's fence deadline it
// came (negative: after it), when there was a previous proof (hadProof).
func (m *Metrics) LeaseRenewed(rtt time.Duration, moved, hadProof bool, headroom time.Duration) {
	if m == nil {
		return
	}
	m.lease.rtt.Observe(rtt.Seconds())
	if moved && hadProof {
		m.lease.headroom.Observe(max(headroom, 0).Seconds())
	}
}

// LeaseRenewalFailed records a failed renewal of the rendezvous lease.
func (m *Metrics) LeaseRenewalFailed(reason string) {
	if m == nil {
		return
	}
	m.lease.failures.WithLabelValues(reason).Inc()
}
