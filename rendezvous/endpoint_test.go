package rendezvous

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestResolver: DNS (here /etc/hosts) first; a name DNS does not know goes
// to the scheduler's node table, whose address may itself be a name.
func TestResolver(t *testing.T) {
	table := func(_ context.Context, name string) (string, error) {
		switch name {
		case "ftl-test-n2.invalid":
			return "127.0.0.3", nil
		case "ftl-test-alias.invalid":
			return "localhost", nil
		}
		return "", errors.New("Node " + name + " not found")
	}
	tests := []struct {
		name     string
		host     string
		nodeAddr func(context.Context, string) (string, error)
		want     string
		err      string
	}{
		{"an IP is its own", "10.1.2.3", nil, "10.1.2.3", ""},
		{"a bracketed IPv6", "[::1]", nil, "::1", ""},
		{"DNS knows localhost, IPv4 first", "localhost", table, "127.0.0.1", ""},
		{"the node table knows a name DNS does not", "ftl-test-n2.invalid", table, "127.0.0.3", ""},
		{"a NodeAddr that is a name is resolved", "ftl-test-alias.invalid", table, "127.0.0.1", ""},
		{"nobody knows it: both sources named", "ftl-test-nowhere.invalid", table, "", "ftl-test-nowhere.invalid does not resolve: DNS: "},
		{"DNS only", "ftl-test-n2.invalid", nil, "", "ftl-test-n2.invalid does not resolve"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ips, err := Resolver{NodeAddr: tt.nodeAddr}.Resolve(tt.host)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Resolve(%s) = %v, %v; want an error containing %q", tt.host, ips, err, tt.err)
				}
				if tt.nodeAddr != nil && !strings.Contains(err.Error(), "scheduler: Node "+tt.host+" not found") {
					t.Errorf("error %q does not name the scheduler's answer", err)
				}
				return
			}
			if err != nil || len(ips) == 0 || ips[0] != tt.want {
				t.Fatalf("Resolve(%s) = %v, %v; want %s first", tt.host, ips, err, tt.want)
			}
		})
	}
}

func TestLocalIPsAndRoute(t *testing.T) {
	if ips := LocalIPs(); !slices.Contains(ips, "127.0.0.1") {
		t.Errorf("LocalIPs() = %v, want 127.0.0.1 among them", ips)
	}
	if got := RouteTo("127.0.0.1"); got != "127.0.0.1" {
		t.Errorf("RouteTo(127.0.0.1) = %q, want 127.0.0.1", got)
	}
}
