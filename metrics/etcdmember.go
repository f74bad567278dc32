package metrics

import "github.com/prometheus/client_golang/prometheus"

// etcdMemberMetrics are the collectors of the embedded etcd member a
// launcher hosts; a launcher that hosts none exports no series of them.
type etcdMemberMetrics struct {
	up       *prometheus.GaugeVec
	exits    *prometheus.CounterVec
	restarts *prometheus.CounterVec
}

func newEtcdMemberMetrics(reg *prometheus.Registry) *etcdMemberMetrics {
	em := &etcdMemberMetrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ftlauncher_etcd_member_up",
			Help: "1 while the embedded etcd member this launcher hosts serves, 0 from its death until it serves again."},
			[]string{"member"}),
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ftlauncher_etcd_member_exits_total",
			Help: "Unexpected exits (deaths) of the embedded etcd member this launcher hosts."},
			[]string{"member"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ftlauncher_etcd_member_restarts_total",
			Help: "Restarts of the embedded etcd member this launcher hosts, by how: rejoined (its data dir intact) or replaced (removed and re-added)."},
			[]string{"member", "how"}),
	}
	reg.MustRegister(em.up, em.exits, em.restarts)
	return em
}

// EtcdMemberUp records that the hosted etcd member (named member, "" for a
// single member) serves.
func (m *Metrics) EtcdMemberUp(member string) {
	if m == nil {
		return
	}
	m.em.up.WithLabelValues(member).Set(1)
}

// EtcdMemberExited records a death of the hosted etcd member.
func (m *Metrics) EtcdMemberExited(member string) {
	if m == nil {
		return
	}
	m.em.up.WithLabelValues(member).Set(0)
	m.em.exits.WithLabelValues(member).Inc()
}

// EtcdMemberRestarted records a restart of the hosted etcd member that
// serves again; how is rejoined or replaced.
func (m *Metrics) EtcdMemberRestarted(member, how string) {
	if m == nil {
		return
	}
	m.em.restarts.WithLabelValues(member, how).Inc()
	m.em.up.WithLabelValues(member).Set(1)
}
