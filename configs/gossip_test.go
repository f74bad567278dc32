package configs

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestGossipConf checks the detector's --rdzv-conf keys: values read,
// defaults left zero, bad values refused with a message naming the key
// and what is allowed.
func TestGossipConf(t *testing.T) {
	good := []struct {
		conf string
		want Gossip
	}{
		{"", Gossip{}},
		{"gossip_probe_interval=0.5,gossip_probe_timeout=0.2", Gossip{ProbeInterval: 500 * time.Millisecond, ProbeTimeout: 200 * time.Millisecond}},
		{"gossip_suspicion_mult=4,gossip_indirect_checks=5", Gossip{SuspicionMult: 4, IndirectChecks: 5}},
		{"gossip_indirect_checks=0", Gossip{IndirectChecks: -1}},
	}
	for _, tt := range good {
		t.Run("read/"+tt.conf, func(t *testing.T) {
			args := []string{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1", "x.py"}
			if tt.conf != "" {
				args = append([]string{"--rdzv-conf", tt.conf}, args...)
			}
			c, err := parse(args, envOf(nil), noGPU(t))
			if err != nil {
				t.Fatal(err)
			}
			if c.Rdzv.Gossip != tt.want {
				t.Errorf("Gossip = %+v, want %+v", c.Rdzv.Gossip, tt.want)
			}
		})
	}
	bad := []struct{ conf, want string }{
		{"gossip_probe_interval=0.001", "gossip_probe_interval=\"0.001\": must be a number of seconds from 0.01 to 60"},
		{"gossip_probe_interval=x", "gossip_probe_interval=\"x\": must be a number of seconds"},
		{"gossip_probe_timeout=0.2", "must be shorter than the probe interval (200ms)"},
		{"gossip_probe_interval=1,gossip_probe_timeout=1", "must be shorter than the probe interval (1s)"},
		{"gossip_suspicion_mult=0", "gossip_suspicion_mult=\"0\": must be a whole number from 1 to 100"},
		{"gossip_suspicion_mult=2.5", "must be a whole number from 1 to 100"},
		{"gossip_indirect_checks=-1", "gossip_indirect_checks=\"-1\": must be a whole number from 0 to 32"},
	}
	for _, tt := range bad {
		t.Run("refused/"+tt.conf, func(t *testing.T) {
			args := []string{"--rdzv-conf", tt.conf, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1", "x.py"}
			_, err := parse(args, envOf(nil), noGPU(t))
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(ue.Msg, tt.want) || !strings.HasPrefix(ue.Msg, "--rdzv-conf") {
				t.Fatalf("parse(%q) = %v, want a usage error with %q", args, err, tt.want)
			}
		})
	}
}
