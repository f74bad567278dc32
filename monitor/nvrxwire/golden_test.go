package nvrxwire

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"testing"
)

type goldenVector struct {
	File     string          `json:"file"`
	Name     string          `json:"name"`
	Protocol int             `json:"protocol"`
	Kind     string          `json:"kind"`
	Expect   json.RawMessage `json:"expect"`
}

func loadGolden(tb testing.TB) []goldenVector {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "golden", "manifest.json"))
	if err != nil {
		tb.Fatalf("read manifest: %v", err)
	}
	var m struct {
		Vectors []goldenVector `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		tb.Fatalf("parse manifest: %v", err)
	}
	if len(m.Vectors) == 0 {
		tb.Fatal("manifest has no vectors")
	}
	return m.Vectors
}

func readGolden(tb testing.TB, file string) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "golden", file))
	if err != nil {
		tb.Fatalf("read %s: %v", file, err)
	}
	return b
}

// canonical renders a Decode result in the same JSON shape as canon() in
// testdata/gen_golden.py.
func canonical(v any) any {
	switch x := v.(type) {
	case nil, bool, string:
		return x
	case int64:
		return map[string]any{"$int": strconv.FormatInt(x, 10)}
	case *big.Int:
		return map[string]any{"$int": x.String()}
	case float64:
		return map[string]any{"$float": fmt.Sprintf("%016x", math.Float64bits(x))}
	case []byte:
		return map[string]any{"$bytes": fmt.Sprintf("%x", x)}
	case ByteArray:
		return map[string]any{"$bytearray": fmt.Sprintf("%x", []byte(x))}
	case []any:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = canonical(it)
		}
		return out
	case Tuple:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = canonical(it)
		}
		return map[string]any{"$tuple": out}
	case *Dict:
		out := make([]any, len(x.Keys))
		for i := range x.Keys {
			out[i] = []any{canonical(x.Keys[i]), canonical(x.Values[i])}
		}
		return map[string]any{"$dict": out}
	case *Set:
		out := make([]any, len(x.Items))
		for i, it := range x.Items {
			out[i] = canonical(it)
		}
		tag := "$set"
		if x.Frozenset {
			tag = "$frozenset"
		}
		return map[string]any{tag: out}
	case *Object:
		args := make([]any, len(x.Args))
		for i, it := range x.Args {
			args[i] = canonical(it)
		}
		o := map[string]any{"$obj": x.Module + "." + x.Name, "args": args}
		if len(x.Args) == 0 { // a class instance, not an enum member
			if x.State == nil {
				o["state"] = map[string]any{"$dict": []any{}}
			} else {
				o["state"] = canonical(x.State)
			}
		}
		return o
	}
	return fmt.Sprintf("<unexpected %T>", v)
}

// normalize round-trips through JSON and sorts set items, so both sides
// compare as plain JSON values independent of set iteration order.
func normalize(tb testing.TB, v any) any {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatalf("marshal: %v", err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		tb.Fatalf("unmarshal: %v", err)
	}
	return sortSets(out)
}

func sortSets(v any) any {
	switch x := v.(type) {
	case []any:
		for i := range x {
			x[i] = sortSets(x[i])
		}
	case map[string]any:
		for k, it := range x {
			x[k] = sortSets(it)
			if k == "$set" || k == "$frozenset" {
				items, _ := x[k].([]any)
				sort.Slice(items, func(i, j int) bool {
					a, _ := json.Marshal(items[i])
					b, _ := json.Marshal(items[j])
					return string(a) < string(b)
				})
			}
		}
	}
	return v
}

func TestGoldenVectors(t *testing.T) {
	vectors := loadGolden(t)
	seen := map[int]int{}
	for _, vec := range vectors {
		seen[vec.Protocol]++
		t.Run(vec.File, func(t *testing.T) {
			payload := readGolden(t, vec.File)
			var expect any
			if err := json.Unmarshal(vec.Expect, &expect); err != nil {
				t.Fatalf("expect: %v", err)
			}
			expect = sortSets(expect)
			switch vec.Kind {
			case "message":
				msg, err := DecodeMessage(payload)
				if err != nil {
					t.Fatalf("DecodeMessage: %v", err)
				}
				if got := normalize(t, msg); !reflect.DeepEqual(got, expect) {
					t.Fatalf("decoded %T\n got  %v\n want %v", msg, got, expect)
				}
			case "generic":
				v, err := Decode(payload)
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if got := normalize(t, canonical(v)); !reflect.DeepEqual(got, expect) {
					t.Fatalf("decoded\n got  %v\n want %v", got, expect)
				}
				if msg, err := DecodeMessage(payload); err == nil {
					t.Fatalf("DecodeMessage accepted a non-request value: %#v", msg)
				}
			default:
				t.Fatalf("unknown vector kind %q", vec.Kind)
			}
		})
	}
	for p := 2; p <= 5; p++ {
		if seen[p] == 0 {
			t.Errorf("no golden vectors for protocol %d", p)
		}
	}
}

// TestGoldenMessageTypes pins the Go type DecodeMessage returns per message.
func TestGoldenMessageTypes(t *testing.T) {
	tests := []struct {
		file string
		want any
	}{
		{"authkey.p4.bin", &AuthkeyMsg{}},
		{"init_v06.p4.bin", &InitMsg{}},
		{"heartbeat.p5.bin", &HeartbeatMsg{}},
		{"section_open_v06.p4.bin", &SectionMsg{}},
		{"update_sections.p4.bin", &UpdateConfigMsg{}},
		{"workload_exclude.p4.bin", &WorkloadControlRequest{}},
		{"control_shutdown.p4.bin", new(ControlString)},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			msg, err := DecodeMessage(readGolden(t, tt.file))
			if err != nil {
				t.Fatalf("DecodeMessage: %v", err)
			}
			if reflect.TypeOf(msg) != reflect.TypeOf(tt.want) {
				t.Fatalf("got %T, want %T", msg, tt.want)
			}
		})
	}
}
