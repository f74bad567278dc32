package pytrace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sourceLine returns line n (1-based) of a generator script in testdata/gen,
// trimmed, so that tests check frames point at the right code rather than at
// line numbers that move when the scripts are edited and rerun.
func sourceLine(t testing.TB, script string, n int) string {
	t.Helper()
	ls := strings.Split(string(readTestdata(t, filepath.Join("gen", script))), "\n")
	if n < 1 || n > len(ls) {
		t.Fatalf("%s has no line %d", script, n)
	}
	return strings.TrimSpace(ls[n-1])
}

func frameStrings(fs []Frame) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.String()
	}
	return out
}

func testdataFiles(t testing.TB) []string {
	t.Helper()
	fs, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(fs) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	return fs
}
