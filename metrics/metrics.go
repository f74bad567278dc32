// Package metrics exposes the launcher's Prometheus metrics on a private
// registry (never the global one, so several launchers or tests can live in
// one process). Every method is safe on a nil *Metrics, which records nothing.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds the launcher's collectors and the registry they live on.
type Metrics struct {
	Registry *prometheus.Registry

	rounds       prometheus.Counter
	restarts     prometheus.Counter
	nodeFailures prometheus.Counter
	rdzvLatency  prometheus.Histogram
	currentRound prometheus.Gauge
	worldSize    prometheus.Gauge
	rankExits    *prometheus.CounterVec
	hangKills    *prometheus.CounterVec

	sparesAllocated   prometheus.Counter
	sparesActive      prometheus.Gauge
	spareSwaps        prometheus.Counter
	fillerPreemptions prometheus.Counter
	swapLatency       *prometheus.HistogramVec

	rankRefused   *prometheus.CounterVec
	rankLogErrors prometheus.Counter
	orphansKilled prometheus.Counter

	ip *inProcessMetrics // --restart-mode in-process (inprocess.go)

	em *etcdMemberMetrics // the hosted embedded etcd member (etcdmember.go)

	fw *fenceWatchdogMetrics // the fence watchdog (fencewatchdog.go)

	st *stragglerMetrics // the ranks' measured speed (straggler.go)

	lease *leaseMetrics // the rendezvous lease's renewals (lease.go)
}

// New creates the collectors and registers them on a fresh registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ftlauncher_rounds_total", Help: "Rendezvous rounds this node completed (active or standby)."}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ftlauncher_restarts_total", Help: "Cycles of this node that ended with a restart of its ranks (spare swaps included)."}),
		nodeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ftlauncher_node_failures_total", Help: "Node losses (gossip or lease expiry) this node detected."}),
		rdzvLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ftlauncher_rendezvous_latency_seconds",
			Help:    "Time from joining a round until its assignment was known.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16)}),
		currentRound: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ftlauncher_current_round", Help: "Current rendezvous round (TORCHELASTIC_RESTART_COUNT)."}),
		worldSize: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ftlauncher_world_size", Help: "WORLD_SIZE of the current round (0 while standby)."}),
	}
	m.rankExits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ftlauncher_rank_exits_total", Help: "Rank processes of this node that exited, by result (success, failure)."},
		[]string{"result"})
	m.hangKills = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ftlauncher_hang_kills_total", Help: "Ranks of this node killed by their monitor, by the timeout that expired."},
		[]string{"timeout_kind"})
	m.sparesAllocated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ftlauncher_spares_allocated_total", Help: "Times this node was parked as a spare (a Spare lease began)."})
	m.sparesActive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ftlauncher_spares_active", Help: "1 while this node is parked as a spare, else 0 (sum over nodes: the job's spares)."})
	m.spareSwaps = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ftlauncher_spares_swaps_total", Help: "Times this spare was promoted to take a lost node's place."})
	m.fillerPreemptions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ftlauncher_filler_preemptions_total", Help: "Times this spare's filler work was reclaimed (killed) for the job."})
	m.swapLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ftlauncher_swap_latency_seconds",
		Help: "Spare swap on the promoted node, by phase: detection (the lost node's first evidence -> round ended, as its detector timed it), " +
			"rendezvous (round opened -> assignment), " +
			"filler_reclaim, spawn (-> every rank exec'd), total (round opened -> every rank exec'd).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"phase"})
	m.rankRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ftlauncher_rank_input_refused_total",
		Help: "Input from ranks the monitors refused, by kind (timeouts, section, connection)."}, []string{"kind"})
	m.rankLogErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ftlauncher_rank_log_write_errors_total", Help: "Failed writes of rank output to its log files (e.g. a full disk)."})
	m.orphansKilled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ftlauncher_rank_orphans_killed_total", Help: "Processes of ranks left after their rank exited that the launcher killed."})
	m.Registry.MustRegister(m.rankRefused, m.rankLogErrors, m.orphansKilled,
		// go_goroutines, process_resident_memory_bytes, process_open_fds...:
		// what a soak (bench/soak.py) watches for growth.
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.Registry.MustRegister(m.rounds, m.restarts, m.nodeFailures, m.rdzvLatency, m.currentRound, m.worldSize,
		m.rankExits, m.hangKills, m.sparesAllocated, m.sparesActive, m.spareSwaps, m.fillerPreemptions, m.swapLatency)
	m.ip = newInProcessMetrics(m.Registry)
	m.em = newEtcdMemberMetrics(m.Registry)
	m.fw = newFenceWatchdogMetrics(m.Registry)
	m.st = newStragglerMetrics(m.Registry)
	m.lease = newLeaseMetrics(m.Registry)
	return m
}

// RoundCompleted records a closed rendezvous round and how long joining took.
func (m *Metrics) RoundCompleted(round, worldSize int, latency time.Duration) {
	if m == nil {
		return
	}
	m.rounds.Inc()
	m.currentRound.Set(float64(round))
	m.worldSize.Set(float64(worldSize))
	m.rdzvLatency.Observe(latency.Seconds())
}

// RankExited records a rank process exit.
func (m *Metrics) RankExited(failed bool) {
	if m == nil {
		return
	}
	result := "success"
	if failed {
		result = "failure"
	}
	m.rankExits.WithLabelValues(result).Inc()
}

// HangKilled records a rank killed by its monitor for a hang of kind
// (heartbeat, section, out_of_section, ...).
func (m *Metrics) HangKilled(kind string) {
	if m == nil {
		return
	}
	m.hangKills.WithLabelValues(kind).Inc()
}

// SpareParked records this node parked as a spare (new says a new Spare
// lease began).
func (m *Metrics) SpareParked(isNew bool) {
	if m == nil {
		return
	}
	if isNew {
		m.sparesAllocated.Inc()
	}
	m.sparesActive.Set(1)
}

// SpareLeft records this node no longer parked (promoted or gone).
func (m *Metrics) SpareLeft() {
	if m == nil {
		return
	}
	m.sparesActive.Set(0)
}

// SpareSwapped records a promotion of this spare, with the phases of the
// swap (zero phases are not observed).
func (m *Metrics) SpareSwapped(preempted bool, phases map[string]time.Duration) {
	if m == nil {
		return
	}
	m.spareSwaps.Inc()
	if preempted {
		m.fillerPreemptions.Inc()
	}
	for p, d := range phases {
		if d > 0 {
			m.swapLatency.WithLabelValues(p).Observe(d.Seconds())
		}
	}
}

// Restarted records a round that ended with a restart.
func (m *Metrics) Restarted() {
	if m == nil {
		return
	}
	m.restarts.Inc()
}

// NodeFailed records a detected node loss.
func (m *Metrics) NodeFailed() {
	if m == nil {
		return
	}
	m.nodeFailures.Inc()
}

// Handler returns the /metrics HTTP handler for this registry.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// Serve listens on addr and serves /metrics until ctx ends, within
// DefaultLimits(). It returns nil after a clean shutdown and an error when
// the address cannot be bound.
func (m *Metrics) Serve(ctx context.Context, addr string) error {
	if m == nil {
		return errors.New("metrics: Serve on nil Metrics")
	}
	ln, err := Listen(addr)
	if err != nil {
		return err
	}
	return m.ServeOn(ctx, ln)
}

// Listen binds addr for ServeOn: the caller learns the address bound (a
// port 0 picks one) before the endpoint serves.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	return ln, nil
}

// ServeOn serves /metrics on ln (from Listen) as Serve does, and closes it.
func (m *Metrics) ServeOn(ctx context.Context, ln net.Listener) error {
	if m == nil {
		ln.Close()
		return errors.New("metrics: ServeOn on nil Metrics")
	}
	lim := DefaultLimits()
	return m.serveListener(ctx, newBoundedListener(ln, lim.MaxConns), lim)
}

func (m *Metrics) serveListener(ctx context.Context, ln *boundedListener, lim Limits) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: lim.ReadHeaderTimeout, ReadTimeout: lim.ReadTimeout,
		WriteTimeout: lim.WriteTimeout, IdleTimeout: lim.IdleTimeout, MaxHeaderBytes: maxHeaderBytes,
		ConnState: ln.connState}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics: serve: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("metrics: shutdown: %w", err)
		}
		<-errc
		return nil
	}
}

// RankInputRefused records one input from a rank a monitor refused (kind:
// timeouts, section, connection).
func (m *Metrics) RankInputRefused(kind string) {
	if m == nil {
		return
	}
	m.rankRefused.WithLabelValues(kind).Inc()
}

// RankLogWriteError records a failed write of rank output to its log.
func (m *Metrics) RankLogWriteError() {
	if m == nil {
		return
	}
	m.rankLogErrors.Inc()
}

// RankOrphansKilled records n leftover rank processes killed.
func (m *Metrics) RankOrphansKilled(n int) {
	if m == nil {
		return
	}
	m.orphansKilled.Add(float64(n))
}
