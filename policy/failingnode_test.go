package policy

import (
	"slices"
	"testing"
)

func TestFailingNode(t *testing.T) {
	tests := []struct {
		name     string
		ran      []int
		evidence []int
		limit    int
		want     bool
		counted  []int
	}{
		{name: "2 of 3", ran: []int{0, 1, 2}, evidence: []int{0, 2}, limit: 2, want: true, counted: []int{0, 2}},
		{name: "2 of 2 (the first two rounds)", ran: []int{0, 1}, evidence: []int{0, 1}, limit: 2, want: true, counted: []int{0, 1}},
		{name: "1 of 3", ran: []int{0, 1, 2}, evidence: []int{1}, limit: 2, counted: []int{1}},
		{name: "old evidence leaves the window", ran: []int{0, 1, 2, 3, 4}, evidence: []int{0, 1, 4}, limit: 2, counted: []int{4}},
		{name: "rounds it sat out do not dilute", ran: []int{0, 5, 9}, evidence: []int{5, 9}, limit: 2, want: true, counted: []int{5, 9}},
		{name: "unsorted and repeated rounds", ran: []int{3, 1, 2, 3}, evidence: []int{1, 3}, limit: 2, want: true, counted: []int{1, 3}},
		{name: "off", ran: []int{0, 1, 2}, evidence: []int{0, 1, 2}, limit: 0},
		{name: "limit 1: any failure", ran: []int{0, 1}, evidence: []int{1}, limit: 1, want: true, counted: []int{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := map[int]bool{}
			for _, r := range tc.evidence {
				ev[r] = true
			}
			counted, window, ok := FailingNode(tc.ran, ev, tc.limit)
			if ok != tc.want || !slices.Equal(counted, tc.counted) {
				t.Errorf("FailingNode = %v %v, want %v %v", counted, ok, tc.counted, tc.want)
			}
			if tc.limit > 0 && window != tc.limit+1 {
				t.Errorf("window %d, want %d", window, tc.limit+1)
			}
		})
	}
}

func TestSwapOutFailingNode(t *testing.T) {
	tests := []struct {
		failing, ended bool
		standbys       int
		want           bool
	}{
		{true, true, 1, true},
		{true, true, 0, false},  // no spare: it keeps its place
		{true, false, 1, false}, // another node's report ended the round
		{false, true, 1, false},
	}
	for _, tc := range tests {
		if got := SwapOutFailingNode(tc.failing, tc.ended, tc.standbys); got != tc.want {
			t.Errorf("SwapOutFailingNode(%v, %v, %d) = %v, want %v", tc.failing, tc.ended, tc.standbys, got, tc.want)
		}
	}
}
