package slurm

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpandNodeList expands a Slurm host list ("n[1-3],gpu[01-02]-ib,login")
// into node names, in order, as `scontrol show hostnames` does. Ranges keep
// their zero padding ("[08-10]" gives 08, 09, 10).
func ExpandNodeList(list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" || list == "(null)" {
		return nil, nil
	}
	var out []string
	for _, item := range splitTop(list) {
		names, err := expandItem(item)
		if err != nil {
			return nil, fmt.Errorf("slurm: node list %q: %w", list, err)
		}
		out = append(out, names...)
	}
	return out, nil
}

// splitTop splits at commas outside brackets.
func splitTop(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// expandItem expands one name with any number of bracketed range groups.
func expandItem(item string) ([]string, error) {
	if item == "" {
		return nil, fmt.Errorf("empty name")
	}
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsRune(item, ']') {
			return nil, fmt.Errorf("unbalanced ']' in %q", item)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unbalanced '[' in %q", item)
	}
	end += open
	prefix, ranges, rest := item[:open], item[open+1:end], item[end+1:]
	tails, err := expandItem(rest)
	if rest == "" {
		tails, err = []string{""}, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range strings.Split(ranges, ",") {
		lo, hi, found := strings.Cut(r, "-")
		if !found {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a > b || a < 0 {
			return nil, fmt.Errorf("bad range %q in %q", r, item)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo)
		}
		for n := a; n <= b; n++ {
			for _, t := range tails {
				out = append(out, fmt.Sprintf("%s%0*d%s", prefix, width, n, t))
			}
		}
	}
	return out, nil
}
