package main

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

func TestEveryInterface(t *testing.T) {
	tests := []struct {
		network, addr string
		want          bool
	}{
		{"tcp", "127.0.0.2:2379", false},
		{"tcp", "0.0.0.0:9400", true},
		{"tcp", "[::]:9400", true},
		{"udp", ":0", true},
		{"tcp", "[::1]:22", false},
		{"tcp", "node1:0", false},
		{"unix", "/tmp/x.sock", false},
		{"tcp", "garbage", false},
	}
	for _, tc := range tests {
		if got := everyInterface(tc.network, tc.addr); got != tc.want {
			t.Errorf("everyInterface(%s, %s) = %v, want %v", tc.network, tc.addr, got, tc.want)
		}
	}
}

func TestURLHost(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.2:2379":  "127.0.0.2:2379",
		"https://[::1]:2380":     "[::1]:2380",
		"127.0.0.2:2379":         "127.0.0.2:2379",
		"http://node1.local:123": "node1.local:123",
	} {
		if got := urlHost(in); got != want {
			t.Errorf("urlHost(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestListenersEmit: one listening record with every socket as added, and
// a log line each, marking a listener on every interface.
func TestListenersEmit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	ev, err := eventlog.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	ls := &listeners{}
	ls.own(listenMetrics, "tcp", "0.0.0.0:9400", "")
	ls.add(eventlog.ListeningSocket{Name: listenEtcdClient, Network: "tcp", Address: "127.0.0.2:2379", PID: 42, Process: etcdCompanion})
	ls.emit(ev, log)
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := eventlog.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0]["event"] != eventlog.Listening {
		t.Fatalf("records %v, want one %s", got, eventlog.Listening)
	}
	socks, _ := got[0]["sockets"].([]any)
	if len(socks) != 2 {
		t.Fatalf("sockets %v, want 2", got[0]["sockets"])
	}
	if s := socks[1].(map[string]any); s["name"] != listenEtcdClient || s["pid"] != float64(42) || s["process"] != etcdCompanion {
		t.Errorf("second socket %v", s)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "name=metrics") || !strings.Contains(lines[0], "every_interface=true") ||
		strings.Contains(lines[1], "every_interface") {
		t.Errorf("log lines:\n%s", buf.String())
	}
}
