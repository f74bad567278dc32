package tcpstore

import (
	"fmt"
	"testing"
)

// BenchmarkSetGet measures one SET followed by a GET (with the WAIT torch's
// client sends before it) on one connection: three round trips' worth of
// server work per iteration, as a rank's store traffic looks.
//
//	go test -run '^$' -bench SetGet -benchtime 2s ./tcpstore/
func BenchmarkSetGet(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.String(), func(b *testing.B) {
			s := startServer(b, Limits{})
			c := dial(b, s.Addr().String(), d)
			keys := make([]string, 1024)
			for i := range keys {
				keys[i] = fmt.Sprintf("/worker/attempt_0/key%d", i)
			}
			for i := 0; b.Loop(); i++ {
				k := keys[i%len(keys)]
				c.set(k, "value")
				if _, err := c.get(k); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
