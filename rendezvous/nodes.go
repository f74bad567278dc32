package rendezvous

import (
	"context"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// roundNodeAddrs lists the advertised addresses of the nodes that have a
// rank entry in round r (its active nodes and the standbys it listed), for
// group rank 0's agent store, which admits connections only from the job's
// nodes. Node ids are <addr>/<pid>, so a keys-only read suffices. nil when
// the read fails: the store then admits every address for the round, which
// costs protection, never a rank.
func (rd *round) roundNodeAddrs(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := rd.cli.Get(ctx, rd.k.ranks(rd.r), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		rd.log.Warn("rendezvous: could not list the round's nodes for the agent store; it admits every address this round",
			"round", rd.r, "err", err)
		return nil
	}
	seen := map[string]bool{}
	out := []string{}
	for _, kv := range resp.Kvs {
		a := nodeAddr(strings.TrimPrefix(string(kv.Key), rd.k.ranks(rd.r)))
		if a != "" && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}
