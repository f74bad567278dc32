package configs

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Value parsers shared by flags, PET_* variables and YAML. Each returns an
// error whose text says what is allowed; the caller prefixes the flag, variable
// or key name.

// isNone reports whether s spells a disabled timeout: none, null or empty
// (case-insensitive, surrounding blanks ignored), as nvrx accepts.
func isNone(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "none", "null":
		return true
	}
	return false
}

// parseFloat parses a finite float.
func parseFloat(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("invalid value %q: must be a number", s)
	}
	return v, nil
}

// parseSeconds parses a number of seconds from 0 to MaxSeconds; positive
// demands at least MinPositiveSeconds.
func parseSeconds(s string, positive bool) (time.Duration, error) {
	v, err := parseFloat(s)
	if err == nil {
		err = checkSeconds(v, positive)
	}
	if err != nil {
		return 0, fmt.Errorf("invalid value %q: %s", s, allowedSeconds(positive))
	}
	return time.Duration(math.Round(v * float64(time.Second))), nil
}

func allowedSeconds(positive bool) string {
	if positive {
		return fmt.Sprintf("must be a number of seconds from %g to %s", MinPositiveSeconds, maxSecondsText)
	}
	return "must be a number of seconds from 0 to " + maxSecondsText
}

// checkSeconds checks a number of seconds: finite, within [0, MaxSeconds],
// and at least MinPositiveSeconds when positive.
func checkSeconds(v float64, positive bool) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > MaxSeconds || (positive && v < MinPositiveSeconds) {
		return errors.New(allowedSeconds(positive))
	}
	return nil
}

// parseIntRange parses an integer from lo to hi.
func parseIntRange(s string, lo, hi int) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("invalid value %q: must be an integer from %d to %d", s, lo, hi)
	}
	return v, nil
}

// checkListenAddr checks a listen address: host:port (host may be empty)
// with a port 0-65535.
func checkListenAddr(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
			err = errors.New("port out of range")
		}
	}
	if err != nil {
		return fmt.Errorf("invalid value %q: must be host:port with a port 0-65535, like 127.0.0.1:9400 or :9400", s)
	}
	return nil
}

// parsePETBool applies torchrun's check_env rule: the variable must be an
// integer string and any non-zero integer means true.
func parsePETBool(s string) (bool, error) {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return false, fmt.Errorf("invalid value %q: must be an integer (0 = off, 1 = on)", s)
	}
	return v != 0, nil
}

// parseFlagBool parses an explicit value given to a switch (--standalone=false).
func parseFlagBool(s string) (bool, error) {
	v, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return false, fmt.Errorf("invalid value %q: must be true or false", s)
	}
	return v, nil
}

// parseNNodes parses N or MIN:MAX with 0 < MIN <= MAX <= MaxNodes.
func parseNNodes(s string) (NNodes, error) {
	bad := fmt.Errorf("invalid value %q: must be N or MIN:MAX with 0 < MIN <= MAX <= %d", s, MaxNodes)
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) > 2 {
		return NNodes{}, bad
	}
	var n [2]int
	for i, p := range parts {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return NNodes{}, bad
		}
		n[i] = v
	}
	if len(parts) == 1 {
		n[1] = n[0]
	}
	if n[0] <= 0 || n[0] > n[1] || n[1] > MaxNodes {
		return NNodes{}, bad
	}
	return NNodes{Min: n[0], Max: n[1]}, nil
}

// checkNProcSpec validates --nproc-per-node without resolving it; resolution
// happens once, after every layer is merged, so an overridden "gpu" never
// probes devices.
func checkNProcSpec(s string) error {
	switch strings.TrimSpace(s) {
	case "cpu", "gpu", "auto":
		return nil
	}
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v <= 0 || v > MaxNProcPerNode {
		return fmt.Errorf("invalid value %q: must be an integer from 1 to %d, cpu, gpu or auto", s, MaxNProcPerNode)
	}
	return nil
}

// resolveNProc turns a checked spec into a count. GPUs are counted from the
// /dev/nvidia<N> device nodes (no CUDA, no python), restricted by
// CUDA_VISIBLE_DEVICES when it is set.
func resolveNProc(spec string, env func(string) string, devDir string, numCPU int) (int, error) {
	switch spec = strings.TrimSpace(spec); spec {
	case "cpu":
		return numCPU, nil
	case "gpu", "auto":
		n, err := countGPUs(devDir, env("CUDA_VISIBLE_DEVICES"))
		if err != nil {
			return 0, err
		}
		if n > 0 {
			return n, nil
		}
		if spec == "auto" {
			return numCPU, nil
		}
		return 0, fmt.Errorf("value gpu: no NVIDIA GPU found (no %s/nvidia<N> device visible through CUDA_VISIBLE_DEVICES); use an integer, cpu or auto", devDir)
	}
	return strconv.Atoi(spec)
}

var nvidiaDev = regexp.MustCompile(`^nvidia[0-9]+$`)

// countGPUs counts NVIDIA device nodes under devDir. A non-empty
// visible list selects devices the way the CUDA runtime does: entries are read
// in order and the first one that is not a present, unrepeated index (or a
// GPU-/MIG- UUID, which cannot be checked without the driver) ends the list.
func countGPUs(devDir, visible string) (int, error) {
	entries, err := os.ReadDir(devDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("counting GPUs: %w", err)
	}
	present := map[int]bool{}
	for _, e := range entries {
		if nvidiaDev.MatchString(e.Name()) {
			idx, _ := strconv.Atoi(strings.TrimPrefix(e.Name(), "nvidia"))
			present[idx] = true
		}
	}
	if strings.TrimSpace(visible) == "" {
		return len(present), nil
	}
	if len(present) == 0 {
		return 0, nil
	}
	seen := map[string]bool{}
	n := 0
	for _, tok := range strings.Split(visible, ",") {
		tok = strings.TrimSpace(tok)
		if seen[tok] {
			break
		}
		seen[tok] = true
		if strings.HasPrefix(tok, "GPU-") || strings.HasPrefix(tok, "MIG-") {
			n++
			continue
		}
		idx, err := strconv.Atoi(tok)
		if err != nil || !present[idx] {
			break
		}
		n++
	}
	return n, nil
}

var (
	stdSingle = regexp.MustCompile(`^[0-3]$`)
	stdMap    = regexp.MustCompile(`^(\d:[0-3],)*(\d:[0-3])$`)
)

// parseStdSpec parses -r/--redirects and -t/--tee: one mask 0-3 for every
// local rank or a map "0:1,1:2" (single-digit local ranks, as torchrun).
func parseStdSpec(s string) (StdSpec, error) {
	switch {
	case stdSingle.MatchString(s):
		return StdSpec{All: Std(s[0] - '0')}, nil
	case stdMap.MatchString(s):
		m := map[int]Std{}
		for _, kv := range strings.Split(s, ",") {
			m[int(kv[0]-'0')] = Std(kv[2] - '0')
		}
		return StdSpec{PerRank: m}, nil
	}
	return StdSpec{}, fmt.Errorf("invalid value %q: must be 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a map of single-digit local ranks like 0:1,1:2", s)
}

// parseRanksFilter parses --local-ranks-filter: comma-separated local ranks.
func parseRanksFilter(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int
	for _, tok := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(tok))
		if err != nil || v < 0 || v >= MaxNProcPerNode {
			return nil, fmt.Errorf("invalid value %q: must be comma-separated local ranks (integers from 0 to %d) like 0,2", s, MaxNProcPerNode-1)
		}
		out = append(out, v)
	}
	return out, nil
}

// parseRdzvConf parses k=v,k=v with torchrun's rules: split on commas, then on
// the first '='; keys and values are trimmed and neither may be empty.
func parseRdzvConf(s string) (map[string]string, error) {
	out := map[string]string{}
	s = strings.TrimSpace(s)
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if k == "" {
			return nil, fmt.Errorf("invalid value %q: must be key=value pairs separated by commas (empty key)", s)
		}
		if v == "" {
			return nil, fmt.Errorf("invalid value %q: key %q must have a value (key=value pairs separated by commas)", s, k)
		}
		out[k] = v
	}
	return out, nil
}

// parseSignal accepts SIGKILL, sigterm, KILL or a signal number.
func parseSignal(s string) (syscall.Signal, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	if n, err := strconv.Atoi(t); err == nil {
		if n > 0 && unix.SignalName(syscall.Signal(n)) != "" {
			return syscall.Signal(n), nil
		}
	} else {
		if !strings.HasPrefix(t, "SIG") {
			t = "SIG" + t
		}
		if sig := unix.SignalNum(t); sig != 0 {
			return sig, nil
		}
	}
	return 0, fmt.Errorf("invalid value %q: must be a signal name (SIGKILL, sigterm, KILL) or number", s)
}

// signalName renders a signal the way nvrx writes it (SIGKILL); unknown numbers stay numeric.
func signalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return strconv.Itoa(int(sig))
}

// parseSignalList parses --signals-to-handle: comma-separated signals.
func parseSignalList(s string) ([]syscall.Signal, error) {
	var out []syscall.Signal
	for _, tok := range strings.Split(s, ",") {
		sig, err := parseSignal(tok)
		if err != nil || strings.TrimSpace(tok) == "" {
			return nil, fmt.Errorf("invalid value %q: must be comma-separated signal names or numbers like SIGTERM,SIGINT", s)
		}
		out = append(out, sig)
	}
	return out, nil
}

// logLevelValue maps a Python logging level name to its number.
func logLevelValue(name string) (int, bool) {
	switch name {
	case "DEBUG", "DBG":
		return 10, true
	case "INFO":
		return 20, true
	case "WARNING", "WARN":
		return 30, true
	case "ERROR":
		return 40, true
	case "CRITICAL":
		return 50, true
	}
	return 0, false
}

// parseLogLevel accepts a Python logging level name or an integer 0-50.
func parseLogLevel(s string) (int, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	if v, ok := logLevelValue(t); ok {
		return v, nil
	}
	if v, err := strconv.Atoi(t); err == nil && v >= 0 && v <= 50 {
		return v, nil
	}
	return 0, fmt.Errorf("invalid value %q: must be DEBUG, DBG, INFO, WARNING, WARN, ERROR, CRITICAL or an integer 0-50", s)
}

// logLevelName renders a level as nvrx's YAML would read it back.
func logLevelName(v int) string {
	for _, name := range []string{"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"} {
		if n, _ := logLevelValue(name); n == v {
			return name
		}
	}
	return strconv.Itoa(v)
}

// parseSectionTimeouts parses "name:val,name:val" where val may be none/null/”.
func parseSectionTimeouts(s string) (map[string]*float64, error) {
	out := map[string]*float64{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(kv, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("invalid value %q: must be name:seconds pairs separated by commas like setup:600,step:180 (seconds may be none)", s)
		}
		if isNone(val) {
			out[name] = nil
			continue
		}
		v, err := parseFloat(val)
		if err == nil {
			err = checkSeconds(v, false)
		}
		if err != nil {
			return nil, fmt.Errorf("invalid value %q: section %q: %s, or none", s, name, allowedSeconds(false))
		}
		out[name] = &v
	}
	return out, nil
}

// nvrx has three boolean conventions for --ft-* values; boolRule picks one.
type boolRule int

const (
	boolNotFalse boolRule = iota // anything but false/0/no is true
	boolOnlyTrue                 // true iff true/1/yes
	boolStrict                   // true/1/yes or false/0/no/'' (else an error)
)

func parseRuleBool(s string, rule boolRule) (bool, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	isTrue := t == "true" || t == "1" || t == "yes"
	isFalse := t == "false" || t == "0" || t == "no"
	switch rule {
	case boolNotFalse:
		return !isFalse, nil
	case boolOnlyTrue:
		return isTrue, nil
	}
	if isTrue {
		return true, nil
	}
	if isFalse || t == "" {
		return false, nil
	}
	return false, fmt.Errorf("invalid value %q: must be true/1/yes or false/0/no", s)
}

// parseAbsPathList checks a comma list of absolute paths.
func parseAbsPathList(s string) (string, error) {
	for _, p := range strings.Split(s, ",") {
		if !filepath.IsAbs(strings.TrimSpace(p)) {
			return "", fmt.Errorf("invalid value %q: must be comma-separated absolute paths", s)
		}
	}
	return s, nil
}

// sortedKeys returns m's keys in order, for deterministic output.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
