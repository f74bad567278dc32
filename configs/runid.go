package configs

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxRunIDLen bounds the run id (--rdzv-id) in bytes. The id becomes part
// of a path element (the run's log directory <run_id>_<up to 10 digits>,
// under the 255-byte NAME_MAX of every Linux file system, with room for a
// longer suffix), of the etcd key prefix and the embedded etcd's cluster
// token. Slurm ids (<job id>-r<N>, <array job>_<task>-r<N>), UUIDs (36),
// Kubernetes Job names (63) and most AppWrapper names (up to 253 in
// theory) fit.
const MaxRunIDLen = 200

// RunIDCharset says, in words, which characters a run id may hold.
const RunIDCharset = "ASCII letters, digits and . _ - + : @"

// runIDAllowed is what a run id is checked against in usage errors.
var runIDAllowed = fmt.Sprintf("1 to %d characters of %s, without '..' "+
	"(a Slurm job id, a UUID, a name like exp-3.v2_a)", MaxRunIDLen, RunIDCharset)

// ValidateRunID reports why id cannot be a run id, or nil. The id names
// files and etcd keys, so only a safe set of characters is allowed:
// nothing that is a path separator or a parent directory ('/', '..'), and
// no whitespace, control character or Unicode format character (a newline
// splits log lines; U+202E, the right-to-left override, makes a directory
// name read backwards).
func ValidateRunID(id string) error {
	if id == "" {
		return fmt.Errorf("empty run id: %s", runIDAllowed)
	}
	if len(id) > MaxRunIDLen {
		return fmt.Errorf("run id of %d bytes (%s): longer than %d; allowed: %s", len(id), clip(id), MaxRunIDLen, runIDAllowed)
	}
	for i, r := range id {
		if r == utf8.RuneError {
			return fmt.Errorf("run id %q is not valid UTF-8 at byte %d; allowed: %s", id, i, runIDAllowed)
		}
		if !runIDRune(r) {
			return fmt.Errorf("run id %q holds %s at byte %d; allowed: %s", id, describeRune(r), i, runIDAllowed)
		}
	}
	if strings.Contains(id, "..") {
		return fmt.Errorf("run id %q holds '..'; allowed: %s", id, runIDAllowed)
	}
	return nil
}

func runIDRune(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("._-+:@", r)
}

// describeRune names a refused character so that an invisible one can be
// seen in the message.
func describeRune(r rune) string {
	switch r {
	case '\n':
		return "a newline (U+000A)"
	case ' ':
		return "a space"
	case '/':
		return "'/' (a path separator)"
	case '\u202e':
		return "a right-to-left override (U+202E)"
	}
	switch {
	case r < 0x20 || r == 0x7f:
		return fmt.Sprintf("a control character (U+%04X)", r)
	case r >= 0x80:
		return fmt.Sprintf("the non-ASCII character U+%04X", r)
	}
	return fmt.Sprintf("%q", r)
}

// clip quotes the start of a long id for a message.
func clip(id string) string {
	const show = 32
	if len(id) <= show {
		return fmt.Sprintf("%q", id)
	}
	cut := show
	for cut > 0 && !utf8.RuneStart(id[cut]) {
		cut--
	}
	return fmt.Sprintf("%q...", id[:cut])
}

// validateRunID checks the run id once every source (flag, PET_RDZV_ID,
// Slurm, Kubernetes, --standalone) had its say, naming that source.
func (p *parser) validateRunID() error {
	if err := ValidateRunID(p.cfg.RdzvID); err != nil {
		subj := p.sourceOr("rdzv-id", "--rdzv-id")
		return usageErr(subj, "%s: %v", subj, err)
	}
	return nil
}
