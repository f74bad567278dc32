package resumer

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseScontrolJob(t *testing.T) {
	at := func(s string) time.Time { return parseTime(s) }
	tests := []struct {
		name string
		line string
		want Job
		ok   bool
	}{
		{"failed", "JobId=3 JobName=wrap JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=3:0 StartTime=2026-11-23T01:07:08 EndTime=2026-11-23T01:07:10 NodeList=n[1-2] NumNodes=2",
			Job{ID: "3", State: "FAILED", Reason: "NonZeroExitCode", ExitCode: 3, NodeList: []string{"n1", "n2"}, NumNodes: 2,
				Start: at("2026-11-23T01:07:08"), End: at("2026-11-23T01:07:10"), Source: "scontrol"}, true},
		{"cancelled by signal", "JobId=5 JobState=CANCELLED Reason=None ExitCode=0:15 StartTime=2026-11-23T01:07:08 EndTime=2026-11-23T01:07:09 NodeList=n1 NumNodes=1",
			Job{ID: "5", State: "CANCELLED", Reason: "None", Signal: 15, NodeList: []string{"n1"}, NumNodes: 1,
				Start: at("2026-11-23T01:07:08"), End: at("2026-11-23T01:07:09"), Source: "scontrol"}, true},
		{"running: EndTime is the limit", "JobId=9 JobState=RUNNING Reason=None ExitCode=0:0 StartTime=2026-11-23T01:07:08 EndTime=Unknown NodeList=n3 NumNodes=1",
			Job{ID: "9", State: "RUNNING", Reason: "None", NodeList: []string{"n3"}, NumNodes: 1, Start: at("2026-11-23T01:07:08"), Source: "scontrol"}, true},
		{"pending: StartTime is an estimate", "JobId=4 JobState=PENDING Reason=Dependency ExitCode=0:0 StartTime=2027-01-01T00:00:00 EndTime=2027-01-01T01:00:00 NodeList=(null) NumNodes=1",
			Job{ID: "4", State: "PENDING", Reason: "Dependency", NumNodes: 1, Source: "scontrol"}, true},
		{"not a job", "slurm_load_jobs error: Invalid job id specified", Job{}, false},
	}
	for _, tt := range tests {
		got, ok := ParseScontrolJob(tt.line)
		if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: ParseScontrolJob =\n %+v %v\nwant\n %+v %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseSacct(t *testing.T) {
	out := "12|NODE_FAIL|0:0|n1|2026-11-23T01:00:00|2026-11-23T01:00:05|1\n" +
		"12|CANCELLED by 0|0:15|n[2-3]|2026-11-23T01:01:00|2026-11-23T01:02:00|2\n" +
		"13|COMPLETED|0:0|n1|2026-11-23T01:03:00|2026-11-23T01:04:00|1\n"
	got, ok := ParseSacct(out, "12")
	want := Job{ID: "12", State: "CANCELLED", Signal: 15, NodeList: []string{"n2", "n3"}, NumNodes: 2,
		Start: parseTime("2026-11-23T01:01:00"), End: parseTime("2026-11-23T01:02:00")}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("ParseSacct = %+v %v, want the last run %+v", got, ok, want)
	}
	if _, ok := ParseSacct(out, "14"); ok {
		t.Error("ParseSacct found an absent job")
	}
}

func TestJobTerminal(t *testing.T) {
	for state, want := range map[string]bool{"PENDING": false, "RUNNING": false, "COMPLETING": false, "REQUEUED": false, "": false,
		"COMPLETED": true, "FAILED": true, "TIMEOUT": true, "CANCELLED": true, "NODE_FAIL": true, "OUT_OF_MEMORY": true, "PREEMPTED": true} {
		if got := (Job{State: state}).Terminal(); got != want {
			t.Errorf("Terminal(%q) = %v, want %v", state, got, want)
		}
	}
}

func TestSubmitEnvDropsTheJobIdentity(t *testing.T) {
	got := submitEnv([]string{"PATH=/bin", "SLURM_JOB_ID=4", "SLURM_CONF=/etc/s.conf", "SLURM_JOB_NODELIST=n1", "FT_X=1"})
	want := []string{"PATH=/bin", "SLURM_CONF=/etc/s.conf", "FT_X=1"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("submitEnv = %v, want %v", got, want)
	}
}

func TestSubmitWithoutSbatchSaysSo(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Scheduler{}.Submit(context.Background(), Submission{Script: "/x/wrapper.sbatch"})
	if err == nil || !strings.Contains(err.Error(), `"sbatch"`) || strings.HasSuffix(strings.TrimSpace(err.Error()), ":") {
		t.Errorf("Submit without sbatch: %v; want an error naming sbatch, with no dangling ': '", err)
	}
	if _, err := (Scheduler{}).Job(context.Background(), "1"); err == nil || strings.HasSuffix(strings.TrimSpace(err.Error()), ":") {
		t.Errorf("Job without scontrol: %v; want an error with no dangling ': '", err)
	}
}
