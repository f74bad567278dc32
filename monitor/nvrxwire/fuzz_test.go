package nvrxwire

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecodeMessage checks that no input panics, hangs or yields a value
// outside the documented result types. Seeds: every golden vector plus the
// encoder's own output.
func FuzzDecodeMessage(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.bin"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no golden seeds: %v", err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	def := defaultConfig()
	f.Add(EncodeOkMsg(&def))
	f.Add(EncodeErrorMsg("x"))
	f.Add(EncodeBytesOK())
	f.Fuzz(func(t *testing.T, payload []byte) {
		msg, err := DecodeMessage(payload)
		if err == nil {
			switch msg.(type) {
			case *AuthkeyMsg, *InitMsg, *HeartbeatMsg, *SectionMsg, *UpdateConfigMsg,
				*WorkloadControlRequest, *ControlString:
			default:
				t.Fatalf("DecodeMessage returned %T", msg)
			}
		}
		v, err := Decode(payload)
		if err == nil {
			// The result must be walkable (acyclic, bounded) without blowing the stack.
			walk(t, v, 0)
		}
	})
}

func walk(t *testing.T, v any, depth int) {
	if depth > MaxDepth+1 {
		t.Fatalf("decoded value nested deeper than %d", MaxDepth)
	}
	switch x := v.(type) {
	case []any:
		for _, it := range x {
			walk(t, it, depth+1)
		}
	case Tuple:
		for _, it := range x {
			walk(t, it, depth+1)
		}
	case *Dict:
		for i := range x.Keys {
			walk(t, x.Keys[i], depth+1)
			walk(t, x.Values[i], depth+1)
		}
	case *Set:
		for _, it := range x.Items {
			walk(t, it, depth+1)
		}
	case *Object:
		for _, it := range x.Args {
			walk(t, it, depth+1)
		}
		if x.Kwargs != nil {
			walk(t, x.Kwargs, depth+1)
		}
		walk(t, x.State, depth+1)
	case *globalRef, *listV, *tupleV:
		t.Fatalf("internal type %T leaked", v)
	}
}
