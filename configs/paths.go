package configs

import (
	"os"
)

// validateVerdictFile refuses a --verdict-file that is an existing
// directory before anything starts: the verdict is renamed over the path
// at exit, which would fail only then (rename: file exists) and leave no
// record of the run.
func (p *parser) validateVerdictFile() error {
	path := p.cfg.VerdictFile
	if path == "" {
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		subj := p.sourceOr("verdict-file", "--verdict-file")
		return usageErr(subj, "%s: %q is a directory: must name a file (e.g. %s/verdict.json), written when the launcher exits", subj, path, path)
	}
	return nil
}
