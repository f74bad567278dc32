package nvrxwire

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

const systemPython = "/usr/bin/python3"

// nvrxConfigFields is every field of nvrx's FaultToleranceConfig.
var nvrxConfigFields = []string{
	"workload_check_interval", "initial_rank_heartbeat_timeout", "rank_heartbeat_timeout",
	"rank_section_timeouts", "rank_out_of_section_timeout", "node_health_check_interval",
	"safety_factor", "rank_termination_signal", "log_level", "restart_check_interval",
	"enable_nic_monitor", "enable_nic_healthcheck", "enable_dist_storage_healthcheck",
	"storage_healthcheck_path", "pci_topo_file", "link_down_path_template", "link_state_path_template",
	"skip_section_response", "segment", "numa_bind_strict", "gpu_memory_reclaim_timeout",
	"gpu_memory_tolerance_mb", "gpu_memory_poll_interval", "check_remaining_processes",
	"max_no_progress_cycles", "min_progress_iterations", "checkpoint_iteration_file",
	"install_exception_hook", "num_warmup_iterations", "attribution_endpoint",
	"attribution_stop_action", "attribution_export_url", "cycle_info_dir",
}

func ptr[T any](v T) *T { return &v }

// defaultConfig is nvrx's FaultToleranceConfig defaults plus ft-launcher's
// extras, the values of configs.DefaultFaultTolerance() (written out here:
// this package does not import configs). It is an encoder input; what the
// monitor advertises is whatever the configuration holds, converted field
// for field (nvrxwire.Config(cfg)).
func defaultConfig() Config {
	return Config{
		WorkloadCheckInterval:   5.0,
		RankSectionTimeouts:     map[string]*float64{},
		NodeHealthCheckInterval: 5.0,
		SafetyFactor:            5.0,
		RankTerminationSignal:   syscall.SIGKILL,
		LogLevel:                20,
		RestartCheckInterval:    60.0,
		EnableNicHealthcheck:    true,
		SkipSectionResponse:     true,
		NumaBindStrict:          true,
		GpuMemoryReclaimTimeout: 50.0,
		GpuMemoryToleranceMB:    512.0,
		GpuMemoryPollInterval:   2.0,
		MaxNoProgressCycles:     3,
		MinProgressIterations:   1,
		NumWarmupIterations:     5,
		NoRestartExitCode:       93,
		TerminationGrace:        5.0,
		CalculateTimeouts:       true,
	}
}

// customConfig differs from the defaults in as many fields as possible.
func customConfig() *Config {
	c := defaultConfig()
	c.InitialRankHeartbeatTimeout = ptr(3600.5)
	c.RankHeartbeatTimeout = ptr(2700.0)
	c.RankSectionTimeouts = map[string]*float64{"setup": ptr(600.0), "step": ptr(180.25), "checkpointing": nil}
	c.RankOutOfSectionTimeout = ptr(300.0)
	c.RankTerminationSignal = syscall.SIGTERM
	c.LogLevel = 10
	c.SkipSectionResponse = false
	c.Segment = ptr(4)
	c.PciTopoFile = ptr("/etc/topo \xff.txt") // invalid UTF-8 must not break the load
	c.CycleInfoDir = ptr(strings.Repeat("d", 300))
	c.MaxNoProgressCycles = -1
	c.NoRestartExitCode = 1 << 40
	c.InstallExceptionHook = true
	return &c
}

// pythonLoads unpickles each payload with CPython and the stand-in classes.
func pythonLoads(t *testing.T, payloads map[string][]byte) map[string]any {
	t.Helper()
	if _, err := os.Stat(systemPython); err != nil {
		testenv.Missing(t, testenv.SystemPython, err.Error()+": cannot cross-check the encoder against CPython")
	}
	dir := t.TempDir()
	args := []string{filepath.Join("testdata", "verify_encoder.py")}
	for name, p := range payloads {
		path := filepath.Join(dir, name+".pkl")
		if err := os.WriteFile(path, p, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, name+"="+path)
	}
	cmd := exec.Command(systemPython, args...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("python failed to unpickle: %v\n%s", err, stderr)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("python output %q: %v", out, err)
	}
	return got
}

func TestEncoderAgainstCPython(t *testing.T) {
	def := defaultConfig()
	got := pythonLoads(t, map[string][]byte{
		"ok_nil":     EncodeOkMsg(nil),
		"ok_default": EncodeOkMsg(&def),
		"ok_custom":  EncodeOkMsg(customConfig()),
		"err":        EncodeErrorMsg("section 'step' is already open \u2603"),
		"err_long":   EncodeErrorMsg(strings.Repeat("x", 70000)),
		"bytes_ok":   EncodeBytesOK(),
	})

	if want := map[string]any{"bytes": "6f6b"}; !reflect.DeepEqual(got["bytes_ok"], want) {
		t.Errorf("bytes_ok: got %v, want %v", got["bytes_ok"], want)
	}
	wantOkNil := map[string]any{"class": DataModule + ".OkMsg", "attrs": map[string]any{}}
	if !reflect.DeepEqual(got["ok_nil"], wantOkNil) {
		t.Errorf("ok_nil: got %v, want %v", got["ok_nil"], wantOkNil)
	}
	wantErr := map[string]any{"class": DataModule + ".ErrorMsg",
		"attrs": map[string]any{"cause": "section 'step' is already open \u2603"}}
	if !reflect.DeepEqual(got["err"], wantErr) {
		t.Errorf("err: got %v, want %v", got["err"], wantErr)
	}
	if c := got["err_long"].(map[string]any)["attrs"].(map[string]any)["cause"]; c != strings.Repeat("x", 70000) {
		t.Errorf("err_long: cause of length %d", len(c.(string)))
	}

	cfgAttrs := func(name string) map[string]any {
		t.Helper()
		ok, _ := got[name].(map[string]any)
		if ok["class"] != DataModule+".OkMsg" {
			t.Fatalf("%s: class %v", name, ok["class"])
		}
		cfg, _ := ok["attrs"].(map[string]any)["cfg"].(map[string]any)
		if cfg["class"] != ConfigModule+"."+ConfigClass {
			t.Fatalf("%s: cfg class %v", name, cfg["class"])
		}
		return cfg["attrs"].(map[string]any)
	}

	tests := []struct {
		cfg  string
		want map[string]any
	}{
		{"ok_default", map[string]any{
			"workload_check_interval":        5.0,
			"initial_rank_heartbeat_timeout": nil,
			"rank_heartbeat_timeout":         nil,
			"rank_section_timeouts":          map[string]any{},
			"rank_termination_signal":        map[string]any{"signal": "SIGKILL", "value": 9.0},
			"log_level":                      20.0,
			"skip_section_response":          true,
			"enable_nic_healthcheck":         true,
			"segment":                        nil,
			"gpu_memory_tolerance_mb":        512.0,
			"max_no_progress_cycles":         3.0,
			"num_warmup_iterations":          5.0,
			"attribution_endpoint":           nil,
			"no_restart_exit_code":           93.0,
			"timeouts_state_file":            "",
			"calculate_timeouts":             true,
		}},
		{"ok_custom", map[string]any{
			"initial_rank_heartbeat_timeout": 3600.5,
			"rank_heartbeat_timeout":         2700.0,
			"rank_section_timeouts":          map[string]any{"setup": 600.0, "step": 180.25, "checkpointing": nil},
			"rank_out_of_section_timeout":    300.0,
			"rank_termination_signal":        map[string]any{"signal": "SIGTERM", "value": 15.0},
			"log_level":                      10.0,
			"skip_section_response":          false,
			"segment":                        4.0,
			"pci_topo_file":                  "/etc/topo \ufffd.txt",
			"cycle_info_dir":                 strings.Repeat("d", 300),
			"max_no_progress_cycles":         -1.0,
			"no_restart_exit_code":           float64(1 << 40),
			"install_exception_hook":         true,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.cfg, func(t *testing.T) {
			attrs := cfgAttrs(tt.cfg)
			for _, f := range nvrxConfigFields {
				if _, ok := attrs[f]; !ok {
					t.Errorf("field %s missing from the encoded config", f)
				}
			}
			for k, want := range tt.want {
				if !reflect.DeepEqual(attrs[k], want) {
					t.Errorf("%s = %#v, want %#v", k, attrs[k], want)
				}
			}
		})
	}
}

func TestEncoderRoundTrip(t *testing.T) {
	cfg := customConfig()
	v, err := Decode(EncodeOkMsg(cfg))
	if err != nil {
		t.Fatalf("Decode(EncodeOkMsg): %v", err)
	}
	ok, isObj := v.(*Object)
	if !isObj || ok.Name != "OkMsg" {
		t.Fatalf("got %s", typeName(v))
	}
	c, _ := ok.Attrs().Get("cfg")
	co, _ := c.(*Object)
	if co == nil || co.Module != ConfigModule || co.Name != ConfigClass {
		t.Fatalf("cfg is %s", typeName(c))
	}
	sig, _ := co.Attrs().Get("rank_termination_signal")
	if n, _ := sig.(*Object).EnumValue(); n != int64(syscall.SIGTERM) {
		t.Errorf("rank_termination_signal = %d", n)
	}
	if _, err := DecodeMessage(EncodeOkMsg(cfg)); err == nil {
		t.Error("DecodeMessage accepted an OkMsg")
	}

	// An out-of-enum signal number goes out as a plain int.
	cfg.RankTerminationSignal = syscall.Signal(40)
	v, err = Decode(EncodeOkMsg(cfg))
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	c, _ = v.(*Object).Attrs().Get("cfg")
	if s, _ := c.(*Object).Attrs().Get("rank_termination_signal"); s != int64(40) {
		t.Errorf("signal 40 encoded as %#v", s)
	}

	e, err := Decode(EncodeErrorMsg("boom"))
	if err != nil {
		t.Fatal(err)
	}
	if cause, _ := e.(*Object).Attrs().Get("cause"); cause != "boom" {
		t.Errorf("cause = %#v", cause)
	}
	b, err := Decode(EncodeBytesOK())
	if err != nil || !reflect.DeepEqual(b, []byte("ok")) {
		t.Errorf("bytes ok = %#v, %v", b, err)
	}
}
