package main

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/configs"
)

// TestRelaySetup: a relay node listens on its address and the relay port,
// a member gets its relay node's resolved address, both the same key from
// the job secret; a port taken or a relay name that does not resolve is a
// warning, and the node registers directly (relays only save requests).
func TestRelaySetup(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("relay-setup-secret-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freePort := free.Addr().(*net.TCPAddr).Port
	free.Close()
	resolve := func(name string) ([]string, error) {
		if name == "n1" {
			return []string{"10.0.0.1"}, nil
		}
		return nil, errors.New("no such host")
	}
	cfgOf := func(index, port int) *configs.Config {
		cfg := &configs.Config{JobSecretFile: secret, RdzvID: "job-7"}
		cfg.Rdzv.Relay = configs.Relay{Group: 2, Port: port, Nodes: []string{"n1", "n2", "n3", "n4"}, Index: index}
		return cfg
	}
	for _, tt := range []struct {
		name            string
		index, port     int
		listen          bool
		relay, warn     string
		wantKey         bool
		addrOfListening string
	}{
		{"a relay listens", 0, freePort, true, "", "", true, "127.0.0.1:" + strconv.Itoa(freePort)},
		{"a member dials its relay", 1, freePort, false, "10.0.0.1:" + strconv.Itoa(freePort), "", true, ""},
		{"the port is taken", 2, takenPort, false, "", "cannot listen on the relay port", false, ""},
		{"the relay does not resolve yet", 3, freePort, false, "n3:" + strconv.Itoa(freePort), "does not resolve yet; resolving it when connecting", true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			ln, relay, key, err := relaySetup(cfgOf(tt.index, tt.port), "127.0.0.1", resolve, slog.New(slog.NewTextHandler(&buf, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if ln != nil {
				defer ln.Close()
			}
			if (ln != nil) != tt.listen || relay != tt.relay || (key != nil) != tt.wantKey {
				t.Fatalf("relaySetup = %v, %q, key %v; want listening %v, relay %q, key %v", ln, relay, key != nil, tt.listen, tt.relay, tt.wantKey)
			}
			if tt.addrOfListening != "" && ln.Addr().String() != tt.addrOfListening {
				t.Fatalf("listening on %s, want %s", ln.Addr(), tt.addrOfListening)
			}
			if tt.warn != "" && !strings.Contains(buf.String(), tt.warn) {
				t.Fatalf("log lacks %q:\n%s", tt.warn, buf.String())
			}
		})
	}
	// Relay and member derive the same key; another run id another one.
	_, _, k1, _ := relaySetup(cfgOf(1, freePort), "127.0.0.1", resolve, slog.New(slog.DiscardHandler))
	k2, _ := relayKeyOf(cfgOf(0, freePort))
	other := cfgOf(0, freePort)
	other.RdzvID = "job-8"
	k3, _ := relayKeyOf(other)
	if !bytes.Equal(k1, k2) || bytes.Equal(k2, k3) || len(k1) != 32 {
		t.Fatalf("keys: member %x, relay %x, other job %x", k1, k2, k3)
	}
}
