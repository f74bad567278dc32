package configs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"gopkg.in/yaml.v3"
)

// Bounds of every numeric input. Each is far beyond any real job and far
// below what would overflow: a duration above ~9.2e9 s wraps negative in a
// time.Duration, so an unbounded --term-timeout meant SIGKILL with no grace.
// docs/architecture.md ("Limits") lists them.
const (
	// MaxSeconds bounds every number of seconds (timeouts, graces,
	// intervals): 7 days, like the --rdzv-conf timings.
	MaxSeconds = 7 * 24 * 3600
	// MinPositiveSeconds is the smallest value where > 0 is required, so
	// that a period never rounds to a zero duration.
	MinPositiveSeconds = 0.001
	// MaxNodes bounds --nnodes, --node-rank and the nvrx segment size.
	MaxNodes = 65536
	// MaxNProcPerNode bounds --nproc-per-node, as given or resolved from
	// cpu/gpu/auto: every local rank costs a process, a monitor and a socket.
	MaxNProcPerNode = 4096
	// MaxCount bounds the other counts (restarts, iterations, cycles, kept
	// attempts).
	MaxCount = 1_000_000_000
	// MaxSafetyFactor bounds the multiplier of calculated timeouts.
	MaxSafetyFactor = 1000
	// MaxMB bounds sizes in MB (the nvrx GPU memory tolerance): 1 EB.
	MaxMB = 1e12
	// MaxYAMLBytes bounds the --ft-cfg-path file: real ones are a few KB,
	// and /dev/zero must not be read until memory runs out.
	MaxYAMLBytes = 1 << 20
	// MaxYAMLNodes bounds the YAML document's node count with every alias
	// expanded, so that an alias bomb (a few hundred bytes naming billions
	// of nodes) is refused instead of walked.
	MaxYAMLNodes = 100_000
)

// maxSecondsText is the upper bound as messages write it.
var maxSecondsText = strconv.Itoa(MaxSeconds) + " (7 days)"

// readBounded reads path, refusing more than limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("larger than the limit of %d bytes", limit)
	}
	return data, nil
}

// errTooManyNodes stops expandedNodes once the bound is passed.
var errTooManyNodes = errors.New("too many nodes")

// expandedNodes counts n's nodes as if every alias were replaced by what it
// names, stopping with errTooManyNodes past limit. Each node's count is
// computed once (memo), so the cost is linear in the document's real size,
// whatever the expansion. yaml.v3 refuses alias cycles while parsing; the
// in-progress mark guards against them anyway.
func expandedNodes(n *yaml.Node, limit int) (int, error) {
	memo := map[*yaml.Node]int{}
	const inProgress = -1
	var count func(n *yaml.Node) (int, error)
	count = func(n *yaml.Node) (int, error) {
		if n == nil {
			return 0, nil
		}
		if c, ok := memo[n]; ok {
			if c == inProgress {
				return 0, errTooManyNodes // a cycle expands without end
			}
			return c, nil
		}
		memo[n] = inProgress
		total := 1
		children := n.Content
		if n.Kind == yaml.AliasNode {
			children = []*yaml.Node{n.Alias}
		}
		for _, c := range children {
			k, err := count(c)
			if err != nil {
				return 0, err
			}
			if total += k; total > limit {
				return 0, errTooManyNodes
			}
		}
		memo[n] = total
		return total, nil
	}
	return count(n)
}
