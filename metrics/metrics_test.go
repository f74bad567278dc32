package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestNilSafe(t *testing.T) {
	var m *Metrics
	m.RoundCompleted(1, 8, time.Second)
	m.Restarted()
	m.NodeFailed()
	m.RankExited(true)
	m.HangKilled("heartbeat")
	m.LeaseRenewed(time.Millisecond, true, true, time.Second)
	m.LeaseRenewalFailed("timeout")
	if err := m.Serve(context.Background(), "127.0.0.1:0"); err == nil {
		t.Fatal("Serve on nil Metrics: want error")
	}
}

func TestServeExposesMetrics(t *testing.T) {
	m := New()
	m.RoundCompleted(3, 16, 250*time.Millisecond)
	m.Restarted()
	m.Restarted()
	m.NodeFailed()
	m.RankExited(false)
	m.RankExited(true)
	m.RankExited(true)
	m.HangKilled("section")
	m.LeaseRenewed(3*time.Millisecond, true, true, 2800*time.Millisecond)
	m.LeaseRenewed(2*time.Second, true, true, -time.Second) // after the deadline: observed as 0
	m.LeaseRenewed(time.Millisecond, false, true, 0)        // overtaken: no headroom
	m.LeaseRenewed(time.Millisecond, true, false, 0)        // the first proof: no headroom
	m.LeaseRenewalFailed("timeout")
	m.LeaseRenewalFailed("expired")
	m.LeaseRenewalFailed("timeout")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- m.serveListener(ctx, newBoundedListener(ln, DefaultLimits().MaxConns), DefaultLimits())
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ftlauncher_rounds_total 1",
		"ftlauncher_restarts_total 2",
		"ftlauncher_node_failures_total 1",
		"ftlauncher_current_round 3",
		"ftlauncher_world_size 16",
		"ftlauncher_rendezvous_latency_seconds_count 1",
		`ftlauncher_rank_exits_total{result="success"} 1`,
		`ftlauncher_rank_exits_total{result="failure"} 2`,
		`ftlauncher_hang_kills_total{timeout_kind="section"} 1`,
		"ftlauncher_lease_renewal_seconds_count 4",
		"ftlauncher_lease_fence_headroom_seconds_count 2",
		`ftlauncher_lease_fence_headroom_seconds_bucket{le="0.05"} 1`,
		`ftlauncher_lease_fence_headroom_seconds_bucket{le="3.2"} 2`,
		`ftlauncher_lease_renewal_failures_total{reason="timeout"} 2`,
		`ftlauncher_lease_renewal_failures_total{reason="expired"} 1`,
		`ftlauncher_lease_renewal_failures_total{reason="stream_ended"} 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics output lacks %q", want)
		}
	}
}

func TestServeBadAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = New().Serve(context.Background(), ln.Addr().String())
	if err == nil || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Fatalf("Serve on a taken address: got %v, want an error naming it", err)
	}
}
