package etcdserver

import (
	"net/url"
	"testing"
)

// TestElectionTimings: a single member (never joined by a peer) ticks every
// 10 ms so that it elects itself within 100 ms of its start; a member of a
// cluster keeps etcd's defaults, which its peers share and which a real
// network needs.
func TestElectionTimings(t *testing.T) {
	curl, _ := url.Parse("http://127.0.0.1:2379")
	purl, _ := url.Parse("http://127.0.0.1:2380")
	tests := []struct {
		name             string
		o                Options
		tick, election   uint
		wantInitialCount int
	}{
		{"single member", Options{}, 10, 100, 1},
		{"member of a new cluster", Options{Name: "a", InitialCluster: "a=http://127.0.0.1:2380,b=http://127.0.0.2:2380"}, 100, 1000, 2},
		{"member added to a running cluster", Options{Name: "b", InitialCluster: "a=http://127.0.0.1:2380,b=http://127.0.0.2:2380",
			ClusterState: "existing"}, 100, 1000, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config(t.TempDir(), curl, purl, tt.o)
			if cfg.TickMs != tt.tick || cfg.ElectionMs != tt.election {
				t.Errorf("tick %d ms, election %d ms; want %d, %d", cfg.TickMs, cfg.ElectionMs, tt.tick, tt.election)
			}
			if err := cfg.Validate(); err != nil && tt.wantInitialCount == 1 {
				t.Errorf("single-member config does not validate: %v", err)
			}
			m, _, err := cfg.PeerURLsMapAndToken("etcd")
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != tt.wantInitialCount {
				t.Errorf("%d initial members, want %d", len(m), tt.wantInitialCount)
			}
		})
	}
}

// BenchmarkStart measures a single member's start until it serves (its
// self-election included): docs/benchmarks.md, "Start-up".
//
//	go test -run '^$' -bench BenchmarkStart -benchtime 15x ./rendezvous/etcdserver/
func BenchmarkStart(b *testing.B) {
	for b.Loop() {
		s, err := Start(b.Context(), Options{ClientURL: "http://127.0.0.1:0", Logger: quiet()})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		s.Close()
		b.StartTimer()
	}
}
