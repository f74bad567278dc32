package eventlog

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestComponentRecordsAsBefore: the components' records (and the rank
// monitors') render the bytes of the maps those components built before
// they were typed (the maps below are theirs, key for key), optional
// fields absent and present.
func TestComponentRecordsAsBefore(t *testing.T) {
	at := time.Date(2026, 12, 5, 15, 1, 2, 345678901, time.UTC)
	base := map[string]any{"run_id": "r", "node": "10.0.0.1"}
	tests := []struct {
		rec    Record
		fields map[string]any
	}{
		// monitor
		{RankFirstHeartbeatEvent{Round: 1, LocalRank: 0, Rank: 3, At: at, SinceInitMS: 1.5},
			map[string]any{"round": 1, "local_rank": 0, "rank": 3, "at": at, "since_init_ms": 1.5}},
		{RankFirstStepEvent{Round: 1, Rank: -1, At: at}, map[string]any{"round": 1, "local_rank": 0, "rank": -1, "at": at}},
		{RankFirstStepEvent{Round: 1, At: at, Iteration: Opt(int64(4))}, map[string]any{"round": 1, "local_rank": 0, "rank": 0, "at": at, "iteration": int64(4)}},
		{RankCheckpointEvent{Round: 2, LocalRank: 1, Rank: 5, OpenedAt: at, At: at, DurationMS: 0.25, Steps: 7},
			map[string]any{"round": 2, "local_rank": 1, "rank": 5, "opened_at": at, "at": at, "duration_ms": 0.25, "steps": int64(7)}},
		{RankStepsEvent{Round: 2, Steps: 9, StepsSinceCheckpoint: 2, Checkpoints: 1, LastStepAt: at},
			map[string]any{"round": 2, "local_rank": 0, "rank": 0, "steps": int64(9), "steps_since_checkpoint": int64(2), "checkpoints": int64(1), "last_step_at": at}},
		{LauncherStallEvent{From: at, To: at, DurationMS: 1200.5}, map[string]any{"from": at, "to": at, "duration_ms": 1200.5}},
		// filler
		{FillerStartedEvent{PID: 5, Start: 1, Command: "sleep 1 <&>", Log: "/l"}, map[string]any{"pid": 5, "start": 1, "command": "sleep 1 <&>", "log": "/l"}},
		{FillerExitedEvent{ExitCode: -9, PID: 5}, map[string]any{"exit_code": -9, "pid": 5}},
		{FillerGaveUpEvent{Reason: "exited 10 times"}, map[string]any{"reason": "exited 10 times"}},
		{FillerReclaimedEvent{TookMS: 12.5}, map[string]any{"took_ms": 12.5}},
		// prewarm
		{PrewarmPausedEvent{Round: "1", LocalRanks: []int{0}}, map[string]any{"round": "1", "local_ranks": []int{0}}},
		{PrewarmWaitingEvent{Round: "1", LocalRank: 1, PID: 7, MaxWaitMS: 10000, Reason: "r"},
			map[string]any{"round": "1", "local_rank": 1, "pid": 7, "max_wait_ms": 10000.0, "reason": "r"}},
		{PrewarmStartedEvent{Round: "0", LocalRanks: []int{0, 1}, HandoverMS: 3.5},
			map[string]any{"round": "0", "local_ranks": []int{0, 1}, "handover_ms": 3.5}},
		{PrewarmStartedEvent{Round: "0", LocalRanks: []int{0}, HandoverMS: 3.5, Spare: true, ParkedMS: Opt(900.0)},
			map[string]any{"round": "0", "local_ranks": []int{0}, "handover_ms": 3.5, "spare": true, "parked_ms": 900.0}},
		{PrewarmStartedEvent{Round: "0", LocalRanks: []int{0, 1}, HandoverMS: 3.5, Launched: true},
			map[string]any{"round": "0", "local_ranks": []int{0, 1}, "handover_ms": 3.5, "launched": true}},
		{PrewarmFallbackEvent{Round: "2", LocalRank: 0, Path: PrewarmPathCold, Reason: "no standby"},
			map[string]any{"round": "2", "local_rank": 0, "path": "cold", "reason": "no standby"}},
		{PrewarmFallbackEvent{Round: "2", LocalRank: 1, Path: PrewarmPathWaited, Reason: "r", StandbyElapsedMS: Opt(1.0), StandbyCPUMS: Opt(2.0),
			WaitMS: Opt(3.0), MaxWaitMS: Opt(4.0), ExpectedWaitCPUMS: Opt(5.0)},
			map[string]any{"round": "2", "local_rank": 1, "path": "waited", "reason": "r", "standby_elapsed_ms": 1.0, "standby_cpu_ms": 2.0,
				"wait_ms": 3.0, "max_wait_ms": 4.0, "expected_wait_cpu_ms": 5.0}},
		{PrewarmResumedEvent{LocalRanks: []int{0}, PausedMS: 8}, map[string]any{"local_ranks": []int{0}, "paused_ms": 8.0}},
		{PrewarmReadyEvent{LocalRank: 1, PID: 7, ImportMS: 100.25, ImportCPUMS: 90},
			map[string]any{"local_rank": 1, "pid": 7, "import_ms": 100.25, "import_cpu_ms": 90.0}},
		{PrewarmDisabledEvent{LocalRank: 0, Reason: "No module named x"}, map[string]any{"local_rank": 0, "reason": "No module named x"}},
		{PrewarmLearnedEvent{Command: "train.py", Modules: []string{"json", "torch"}, Ranks: 2, Cycles: 1, StateFile: "/s"},
			map[string]any{"command": "train.py", "modules": []string{"json", "torch"}, "ranks": 2, "cycles": 1, "state_file": "/s"}},
		{PrewarmUnsafeEvent{Command: "train.py", Module: "m", Reason: "r", LocalRank: 1},
			map[string]any{"command": "train.py", "module": "m", "reason": "r", "local_rank": 1}},
		{PrewarmSpareReadyEvent{LocalRanks: []int{0, 1}, PIDs: []int{7, 8}, Modules: []string{"json"}, ReadyMS: 5},
			map[string]any{"local_ranks": []int{0, 1}, "pids": []int{7, 8}, "modules": []string{"json"}, "ready_ms": 5.0}},
		{PrewarmSpareDiedEvent{LocalRank: 0, PID: 7, Reason: "r", Deaths: 1, RestartInMS: Opt(1000.0)},
			map[string]any{"local_rank": 0, "pid": 7, "reason": "r", "deaths": 1, "restart_in_ms": 1000.0}},
		{PrewarmSpareDiedEvent{LocalRank: 0, PID: 7, Reason: "r", Deaths: 2, GaveUp: true},
			map[string]any{"local_rank": 0, "pid": 7, "reason": "r", "deaths": 2, "gave_up": true}},
		// agentstore
		{AgentStoreServedEvent{Round: 1, Addr: "10.0.0.1:5", KeysDropped: 3, AllowedAddrs: -1},
			map[string]any{"round": 1, "addr": "10.0.0.1:5", "keys_dropped": 3, "allowed_addrs": -1}},
		{AgentStoreClosedEvent{Round: 1, Addr: "a", Why: "w", Keys: 2, Refused: 3, NotMember: 4, NoHandshake: 5, PerAddrCap: 6, IdleAtReset: 7},
			map[string]any{"round": 1, "addr": "a", "why": "w", "keys": 2, "refused": uint64(3), "not_member": uint64(4), "no_handshake": uint64(5),
				"per_addr_cap": uint64(6), "idle_at_reset": uint64(7)}},
		// the embedded etcd member's keeper
		{EtcdMemberExitedEvent{Member: "m1", PID: 9, Exit: "killed by SIGKILL", ExitCode: -1, Signal: "SIGKILL", ServedS: 2.5, Restart: true},
			map[string]any{"member": "m1", "pid": 9, "exit": "killed by SIGKILL", "exit_code": -1, "signal": "SIGKILL", "served_s": 2.5, "restart": true}},
		{EtcdMemberRestartedEvent{Member: "m1", PID: 10, How: verdict.EtcdMemberRejoined, Attempts: 1, TookS: 1.25, DeadPID: 9},
			map[string]any{"member": "m1", "pid": 10, "how": "rejoined", "attempts": 1, "took_s": 1.25, "dead_pid": 9}},
		{EtcdMemberGaveUpEvent{Member: "m1", Why: "w", Attempts: 3}, map[string]any{"member": "m1", "why": "w", "attempts": 3}},
		{EtcdPeerMemberDownEvent{Peer: "m2", Endpoint: "http://h:2379", Err: "e"}, map[string]any{"peer": "m2", "endpoint": "http://h:2379", "err": "e"}},
		{EtcdPeerMemberUpEvent{Peer: "m2", Endpoint: "http://h:2379"}, map[string]any{"peer": "m2", "endpoint": "http://h:2379"}},
	}
	ts := at.Format(time.RFC3339Nano)
	covered := map[reflect.Type]bool{}
	for _, tt := range tests {
		covered[reflect.TypeOf(tt.rec)] = true
		got, err := encode(base, tt.rec, ts)
		if err != nil {
			t.Fatalf("%s: %v", tt.rec.Kind(), err)
		}
		if want := oldEncode(base, tt.rec.Kind(), tt.fields, ts); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %s\nwant %s", tt.rec.Kind(), got, want)
		}
	}
	for _, r := range componentRecords() {
		if !covered[reflect.TypeOf(r)] {
			t.Errorf("%s (%T) has no case: add the map its component built", r.Kind(), r)
		}
	}
}
