package slurm

import (
	"context"
	"reflect"
	"strings"
	"testing"
)

func TestParseScontrolNodes(t *testing.T) {
	out := "NodeName=n1 Arch=x86_64 NodeAddr=127.0.0.2 NodeHostName=vm State=IDLE Partitions=debug,long\nNodeName=n2 NodeAddr=127.0.0.3 NodeHostName=vm State=DOWN+DRAIN Partitions=debug\n"
	want := []NodeInfo{{Name: "n1", Addr: "127.0.0.2", Hostname: "vm", State: "IDLE", Partitions: []string{"debug", "long"}},
		{Name: "n2", Addr: "127.0.0.3", Hostname: "vm", State: "DOWN+DRAIN", Partitions: []string{"debug"}}}
	if got := ParseScontrolNodes(out); !reflect.DeepEqual(got, want) {
		t.Errorf("ParseScontrolNodes = %+v, want %+v", got, want)
	}
}

func TestRunWithoutTheCommandSaysSo(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Scheduler{}.Run(context.Background(), "scontrol", "show", "node", "-o")
	if err == nil || !strings.Contains(err.Error(), `"scontrol"`) || strings.HasSuffix(strings.TrimSpace(err.Error()), ":") {
		t.Errorf("Run without scontrol: %v; want an error naming scontrol, with no dangling ': '", err)
	}
}
