package tcpstore

// This file is long on purpose: it is the store server's one suite, every
// query of torch's TCPStore protocol and each of the server's limits
// (connections, waiters, queued bytes, registrations, garbage clients)
// against a real listener, sharing one set of client helpers. Its tests
// differ by the limit they push, not by a concern a split could follow.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

func startServer(t testing.TB, lim Limits) *Server {
	t.Helper()
	s, err := Listen(context.Background(), "127.0.0.1:0", Options{
		Limits: lim,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// eventually polls cond for up to 20 s: behaviour, not speed.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// must fails the test on an error: must[string](t)(c.get(key)).
func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

var dialects = []dialect{dialectLegacy, dialectV2}

// TestQueries runs every query each dialect has through the wire client.
func TestQueries(t *testing.T) {
	type tc struct {
		name     string
		dialects []dialect // nil: both
		run      func(t *testing.T, c *wireClient, s *Server)
	}
	cases := []tc{
		{"set and get", nil, func(t *testing.T, c *wireClient, s *Server) {
			c.set("/a", "1")
			c.set("/a", "two")
			if v := must[string](t)(c.get("/a")); v != "two" {
				t.Fatalf("get = %q, want two", v)
			}
			c.set("/empty", "")
			if v := must[string](t)(c.get("/empty")); v != "" {
				t.Fatalf("get empty = %q", v)
			}
		}},
		{"get of a missing key reads empty", nil, func(t *testing.T, c *wireClient, s *Server) {
			if v := must[string](t)(c.getNoWait("/missing")); v != "" {
				t.Fatalf("get = %q, want empty", v)
			}
		}},
		{"add", nil, func(t *testing.T, c *wireClient, s *Server) {
			for i, want := range []int64{5, 2, -10} {
				delta := []int64{5, -3, -12}[i]
				if got := must[int64](t)(c.add("/n", delta)); got != want {
					t.Fatalf("add %d = %d, want %d", delta, got, want)
				}
			}
			if v := must[string](t)(c.get("/n")); v != "-10" {
				t.Fatalf("value after adds = %q, want -10 (decimal text, as torch stores it)", v)
			}
		}},
		{"add to a non-number refuses the client", nil, func(t *testing.T, c *wireClient, s *Server) {
			c.set("/text", "abc")
			before := s.Stats().Refused
			c.send(opAdd, str("/text"), u64(1))
			c.expectClosed()
			eventually(t, "refusal counted", func() bool { return s.Stats().Refused == before+1 })
		}},
		{"compare_set", nil, func(t *testing.T, c *wireClient, s *Server) {
			steps := []struct{ expected, desired, want string }{
				{"x", "y", "x"},  // missing key, non-empty expected: answers expected, sets nothing
				{"", "v1", "v1"}, // missing key, empty expected: sets
				{"no", "v2", "v1"},
				{"v1", "v2", "v2"},
			}
			for _, st := range steps {
				if got := must[string](t)(c.compareSet("/cas", st.expected, st.desired)); got != st.want {
					t.Fatalf("compare_set(%q,%q) = %q, want %q", st.expected, st.desired, got, st.want)
				}
			}
			if v := must[string](t)(c.get("/cas")); v != "v2" {
				t.Fatalf("get = %q", v)
			}
		}},
		{"check", nil, func(t *testing.T, c *wireClient, s *Server) {
			c.set("/c1", "x")
			if !must[bool](t)(c.check("/c1")) {
				t.Fatal("check of a set key = not ready")
			}
			if must[bool](t)(c.check("/c1", "/c2")) {
				t.Fatal("check with a missing key = ready")
			}
			if !must[bool](t)(c.check()) {
				t.Fatal("check of no keys = not ready")
			}
		}},
		{"wait answered at once and after a set", nil, func(t *testing.T, c *wireClient, s *Server) {
			c.set("/w1", "x")
			if err := c.wait(ioTimeout, "/w1"); err != nil {
				t.Fatal(err)
			}
			other := dial(t, s.Addr().String(), c.d)
			done := make(chan error, 1)
			go func() { done <- c.wait(ioTimeout, "/w1", "/w2", "/w3") }()
			eventually(t, "the wait is registered", func() bool { return s.Stats().Waiters == 2 })
			other.set("/w2", "x")
			other.set("/w3", "x")
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if w := s.Stats().Waiters; w != 0 {
				t.Fatalf("waiters = %d after the wait ended", w)
			}
		}},
		{"wait with a timeout", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			if err := c.wait(100*time.Millisecond, "/never"); !errors.Is(err, errWaitTimeout) {
				t.Fatalf("wait = %v, want a timeout", err)
			}
			if w := s.Stats().Waiters; w != 0 {
				t.Fatalf("waiters = %d after CANCEL_WAIT", w)
			}
			// The connection carries no stray reply: the next query works.
			c.set("/never", "now")
			if v := must[string](t)(c.get("/never")); v != "now" {
				t.Fatalf("get = %q", v)
			}
		}},
		{"cancel_wait", nil, func(t *testing.T, c *wireClient, s *Server) {
			// Sent by hand: the stand-in's legacy wait gives up without
			// cancelling, like 1.13, but the legacy numbering has the query
			// (type 12).
			c.send(opWait, keysArg([]string{"/missing"}))
			eventually(t, "the wait is registered", func() bool { return s.Stats().Waiters == 1 })
			c.send(opCancelWait)
			if b := must[byte](t)(c.readByte()); b != waitCanceled {
				t.Fatalf("reply %d, want WAIT_CANCELED", b)
			}
			if w := s.Stats().Waiters; w != 0 {
				t.Fatalf("waiters = %d after CANCEL_WAIT", w)
			}
			// The key came first: STOP_WAITING, then WAIT_CANCELED.
			c.send(opWait, keysArg([]string{"/late"}))
			other := dial(t, s.Addr().String(), c.d)
			other.set("/late", "x")
			must[int64](t)(other.numKeys()) // the SET has been served
			c.send(opCancelWait)
			for _, want := range []byte{waitStopWaiting, waitCanceled} {
				if b := must[byte](t)(c.readByte()); b != want {
					t.Fatalf("reply %d, want %d", b, want)
				}
			}
			// Nothing stray is left on the connection.
			if n := must[int64](t)(c.numKeys()); n != 1 {
				t.Fatalf("num keys = %d, want 1", n)
			}
		}},
		{"getnumkeys", nil, func(t *testing.T, c *wireClient, s *Server) {
			c.set("/k1", "a")
			c.set("/k2", "b")
			if n := must[int64](t)(c.numKeys()); n != 2 {
				t.Fatalf("num keys = %d, want 2", n)
			}
		}},
		{"delete_key", nil, func(t *testing.T, c *wireClient, s *Server) {
			c.set("/d", "a")
			if !must[bool](t)(c.deleteKey("/d")) {
				t.Fatal("delete of a set key = false")
			}
			if must[bool](t)(c.deleteKey("/d")) {
				t.Fatal("second delete = true")
			}
			if must[bool](t)(c.check("/d")) {
				t.Fatal("deleted key still there")
			}
			if st := s.Stats(); st.Keys != 0 || st.Bytes != 0 {
				t.Fatalf("stats after delete = %+v", st)
			}
		}},
		{"append", nil, func(t *testing.T, c *wireClient, s *Server) {
			c.appendTo("/ap", "ab")
			c.appendTo("/ap", "cd")
			if v := must[string](t)(c.get("/ap")); v != "abcd" {
				t.Fatalf("get = %q", v)
			}
		}},
		{"multi_set and multi_get", nil, func(t *testing.T, c *wireClient, s *Server) {
			c.multiSet("/m1", "a", "/m2", "", "/m3", "ccc")
			got := must[[]string](t)(c.multiGet("/m3", "/m1", "/m2"))
			if strings.Join(got, ",") != "ccc,a," {
				t.Fatalf("multi_get = %q", got)
			}
		}},
		{"ping", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			if n := must[uint32](t)(c.ping(12345)); n != 12345 {
				t.Fatalf("ping = %d", n)
			}
		}},
		{"queues", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			if _, ok := must2(t)(c.queuePop("/q", false)); ok {
				t.Fatal("pop of an empty queue returned an item")
			}
			c.queuePush("/q", "1")
			c.queuePush("/q", "2")
			if n := must[int64](t)(c.queueLen("/q")); n != 2 {
				t.Fatalf("queue_len = %d", n)
			}
			if !must[bool](t)(c.check("/q")) {
				t.Fatal("check of a non-empty queue = not ready")
			}
			for _, want := range []string{"1", "2"} {
				v, ok := must2(t)(c.queuePop("/q", true))
				if !ok || v != want {
					t.Fatalf("pop = %q %v, want %q", v, ok, want)
				}
			}
			if must[bool](t)(c.check("/q")) {
				t.Fatal("check of an emptied queue = ready")
			}
			// A blocking pop waits for the next push; one push lets one pop go.
			other := dial(t, s.Addr().String(), c.d)
			got := make(chan string, 1)
			go func() {
				v, _, err := c.queuePop("/q", true)
				if err != nil {
					v = err.Error()
				}
				got <- v
			}()
			eventually(t, "the pop waits", func() bool { return s.Stats().Waiters == 1 })
			other.queuePush("/q", "3")
			if v := <-got; v != "3" {
				t.Fatalf("blocking pop = %q", v)
			}
			if st := s.Stats(); st.Keys != 0 || st.Bytes != 0 || st.Waiters != 0 {
				t.Fatalf("stats after the queue emptied = %+v", st)
			}
		}},
		{"list_keys on an empty store", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			if keys := must[[]string](t)(c.listKeys()); len(keys) != 0 {
				t.Fatalf("list_keys = %q, want none", keys)
			}
		}},
		{"list_keys lists the keys, not the queues", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			c.set("/b", "1")
			c.set("/a", "")
			must[int64](t)(c.add("/n", 1))
			c.queuePush("/q", "x")
			c.multiSet("/m", "v")
			if got := strings.Join(must[[]string](t)(c.listKeys()), ","); got != "/a,/b,/m,/n" {
				t.Fatalf("list_keys = %q, want /a,/b,/m,/n", got)
			}
			must[bool](t)(c.deleteKey("/b"))
			if got := strings.Join(must[[]string](t)(c.listKeys()), ","); got != "/a,/m,/n" {
				t.Fatalf("list_keys after delete = %q, want /a,/m,/n", got)
			}
			// The reservation covers the reply being written and is
			// released right after it, so the client can read the reply
			// first: wait for the release, which must come.
			eventually(t, "LIST_KEYS's reservation released", func() bool { return s.inflight.Load() == 0 })
		}},
		{"barrier of three", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			addr := s.Addr().String()
			second, third := dial(t, addr, c.d), dial(t, addr, c.d)
			c.sendBarrier("/bar", 3)
			eventually(t, "the first waits", func() bool { return s.Stats().Waiters == 1 })
			second.sendBarrier("/bar", 3)
			eventually(t, "the second waits", func() bool { return s.Stats().Waiters == 2 })
			c.expectSilent(100 * time.Millisecond)
			second.expectSilent(10 * time.Millisecond)
			third.sendBarrier("/bar", 3)
			for i, x := range []*wireClient{third, c, second} {
				if b := must[byte](t)(x.readByte()); b != waitStopWaiting {
					t.Fatalf("client %d: reply %d, want STOP_WAITING", i, b)
				}
			}
			if v := must[string](t)(c.getNoWait("/bar")); v != "3" {
				t.Fatalf("barrier count = %q, want 3", v)
			}
			if w := s.Stats().Waiters; w != 0 {
				t.Fatalf("waiters = %d after the barrier", w)
			}
			// Past the world size, an arrival goes straight through.
			third.sendBarrier("/bar", 3)
			if b := must[byte](t)(third.readByte()); b != waitStopWaiting {
				t.Fatalf("late arrival: reply %d", b)
			}
			// A barrier of one, on a missing key, too.
			c.sendBarrier("/solo", 1)
			if b := must[byte](t)(c.readByte()); b != waitStopWaiting {
				t.Fatalf("barrier of one: reply %d", b)
			}
			if v := must[string](t)(c.getNoWait("/solo")); v != "1" {
				t.Fatalf("barrier of one count = %q, want 1", v)
			}
		}},
		{"barrier counts on from an ADD", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			must[int64](t)(c.add("/bar", 1))
			c.sendBarrier("/bar", 2)
			if b := must[byte](t)(c.readByte()); b != waitStopWaiting {
				t.Fatalf("reply %d, want STOP_WAITING", b)
			}
		}},
		{"barrier cancelled", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			c.sendBarrier("/bar", 2)
			eventually(t, "the barrier waits", func() bool { return s.Stats().Waiters == 1 })
			c.send(opCancelWait)
			if b := must[byte](t)(c.readByte()); b != waitCanceled {
				t.Fatalf("reply %d, want WAIT_CANCELED", b)
			}
			if w := s.Stats().Waiters; w != 0 {
				t.Fatalf("waiters = %d after CANCEL_WAIT", w)
			}
			// The arrival stays counted (as in torch): the next one completes
			// the barrier and nothing stray reaches the cancelled client.
			other := dial(t, s.Addr().String(), c.d)
			other.sendBarrier("/bar", 2)
			if b := must[byte](t)(other.readByte()); b != waitStopWaiting {
				t.Fatalf("second arrival: reply %d", b)
			}
			if n := must[uint32](t)(c.ping(5)); n != 5 {
				t.Fatalf("ping after the cancelled barrier = %d", n)
			}
		}},
		{"wait on a barrier key waits for the last arrival", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			addr := s.Addr().String()
			b1, b2 := dial(t, addr, c.d), dial(t, addr, c.d)
			c.send(opWait, keysArg([]string{"/bar", "/other"}))
			eventually(t, "the wait is registered", func() bool { return s.Stats().Waiters == 2 })
			b1.sendBarrier("/bar", 2)
			eventually(t, "the barrier waits", func() bool { return s.Stats().Waiters == 3 })
			// The key now exists, but its waiters were not counted off.
			if !must[bool](t)(b2.check("/bar")) {
				t.Fatal("check of the barrier key after an arrival = not ready")
			}
			if w := s.Stats().Waiters; w != 3 {
				t.Fatalf("waiters = %d after a non-final arrival, want 3", w)
			}
			b2.sendBarrier("/bar", 2)
			for i, x := range []*wireClient{b2, b1} {
				if b := must[byte](t)(x.readByte()); b != waitStopWaiting {
					t.Fatalf("arrival %d: reply %d", i, b)
				}
			}
			// c's wait is counted off /bar but still needs /other.
			eventually(t, "one registration left", func() bool { return s.Stats().Waiters == 1 })
			c.expectSilent(50 * time.Millisecond)
			b1.set("/other", "x")
			if b := must[byte](t)(c.readByte()); b != waitStopWaiting {
				t.Fatalf("wait reply %d", b)
			}
		}},
		{"barrier on a non-number refuses the client", []dialect{dialectV2}, func(t *testing.T, c *wireClient, s *Server) {
			other := dial(t, s.Addr().String(), c.d)
			other.set("/text", "abc")
			must[int64](t)(other.numKeys()) // the SET has been served
			c.sendBarrier("/text", 2)
			c.expectClosed()
			eventually(t, "refusal counted", func() bool { return s.Stats().Refused == 1 })
			if v := must[string](t)(other.getNoWait("/text")); v != "abc" {
				t.Fatalf("value after the refused barrier = %q", v)
			}
		}},
		{"watch_key", []dialect{dialectLegacy}, func(t *testing.T, c *wireClient, s *Server) {
			// 1.13's callback connection: WATCH_KEY, then updates.
			c.send(opWatchKey, str("/wk"))
			if b := must[byte](t)(c.readByte()); b != watchKeyCallbackRegistered {
				t.Fatalf("watch reply %d", b)
			}
			other := dial(t, s.Addr().String(), c.d)
			other.set("/wk", "a")
			other.set("/wk", "b")
			other.appendTo("/wk", "c")
			must[int64](t)(other.add("/other", 1))
			must[bool](t)(other.deleteKey("/wk"))
			want := []watchEvent{
				{watchKeyCreated, "/wk", "", "a"},
				{watchKeyUpdated, "/wk", "a", "b"},
				{watchKeyAppended, "/wk", "b", "bc"},
				{watchKeyDeleted, "/wk", "bc", ""},
			}
			for _, w := range want {
				if ev := must[watchEvent](t)(c.readWatchEvent()); ev != w {
					t.Fatalf("watch event %+v, want %+v", ev, w)
				}
			}
		}},
	}
	for _, d := range dialects {
		for _, tc := range cases {
			if tc.dialects != nil && tc.dialects[0] != d {
				continue
			}
			t.Run(d.String()+"/"+tc.name, func(t *testing.T) {
				s := startServer(t, Limits{})
				tc.run(t, dial(t, s.Addr().String(), d), s)
			})
		}
	}
}

func must2(t testing.TB) func(string, bool, error) (string, bool) {
	return func(v string, ok bool, err error) (string, bool) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v, ok
	}
}

// TestDialectDetection: the first bytes decide, and the legacy SET (0) and
// the v2 VALIDATE (0) cannot be confused.
func TestDialectDetection(t *testing.T) {
	s := startServer(t, Limits{})
	addr := s.Addr().String()

	// A legacy connection whose first query is SET (type byte 0).
	legacy := dialRaw(t, addr, dialectLegacy)
	legacy.set("/first", "legacy")
	if v := must[string](t)(legacy.get("/first")); v != "legacy" {
		t.Fatalf("legacy get = %q", v)
	}
	// A v2 connection; its GET is type 3, which legacy reads as ADD.
	v2 := dial(t, addr, dialectV2)
	if v := must[string](t)(v2.get("/first")); v != "legacy" {
		t.Fatalf("v2 get = %q", v)
	}
	// A v2 client that does not validate first is refused: it is taken for a
	// legacy client, whose query 0 (SET) would then carry a 1 GiB+ key.
	before := s.Stats().Refused
	bad := dialRaw(t, addr, dialectV2)
	bad.sendRaw(append([]byte{0}, u32(0x12345678)...))
	bad.sendRaw(u32(0x01)) // rest of a "key length"
	bad.expectClosed()
	eventually(t, "refusal counted", func() bool { return s.Stats().Refused == before+1 })
	// An unknown query type is refused.
	unknown := dial(t, addr, dialectV2)
	unknown.sendRaw([]byte{200})
	unknown.expectClosed()
	// VALIDATE again later is refused, as torch's server does.
	again := dial(t, addr, dialectV2)
	again.send(opValidate, u32(validationMagic))
	again.expectClosed()
	// Others carry on.
	if v := must[string](t)(v2.get("/first")); v != "legacy" {
		t.Fatalf("v2 get after refusals = %q", v)
	}
}

// TestLegacyType7: WATCH_KEY on a fresh legacy connection (and again on
// that callback connection) is a watch; type 7 after other queries is taken
// for a torch 2.1-era DELETE_KEY and refused with a reason naming the fix.
func TestLegacyType7(t *testing.T) {
	var logs recorder
	s, err := Listen(context.Background(), "127.0.0.1:0", Options{Logger: slog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.Addr().String()

	watcher := dial(t, addr, dialectLegacy)
	for _, k := range []string{"/a", "/b"} {
		watcher.send(opWatchKey, str(k))
		if b := must[byte](t)(watcher.readByte()); b != watchKeyCallbackRegistered {
			t.Fatalf("watch %s: reply %d", k, b)
		}
	}
	setter := dial(t, addr, dialectLegacy)
	setter.set("/b", "x")
	want := watchEvent{watchKeyCreated, "/b", "", "x"}
	if ev := must[watchEvent](t)(watcher.readWatchEvent()); ev != want {
		t.Fatalf("watch event %+v, want %+v", ev, want)
	}

	// What a 2.1-era client sends for delete_key("/b") after its other
	// queries: type 7, then the key.
	setter.sendRaw(append([]byte{7}, str("/b")...))
	setter.expectClosed()
	eventually(t, "the refusal is counted", func() bool { return s.Stats().Refused == 1 })
	log := logs.String()
	for _, w := range []string{"torch 2.1-era client", "--agent-store off", "dialect=legacy"} {
		if !strings.Contains(log, w) {
			t.Fatalf("refusal log lacks %q:\n%s", w, log)
		}
	}
	// The key was not deleted, and the watcher is still served.
	other := dial(t, addr, dialectLegacy)
	if v := must[string](t)(other.get("/b")); v != "x" {
		t.Fatalf("get = %q after the refused type 7", v)
	}
	other.set("/a", "y")
	want = watchEvent{watchKeyCreated, "/a", "", "y"}
	if ev := must[watchEvent](t)(watcher.readWatchEvent()); ev != want {
		t.Fatalf("watch event %+v, want %+v", ev, want)
	}
	if w := s.Stats().Waiters; w != 2 {
		t.Fatalf("waiters = %d, want the 2 watches", w)
	}
}

// TestConcurrentWaiters: many clients wait on keys set later by another.
func TestConcurrentWaiters(t *testing.T) {
	const n = 64
	s := startServer(t, Limits{})
	addr := s.Addr().String()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		c := dial(t, addr, dialects[i%2])
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every waiter needs its own key and the shared one.
			if err := c.wait(ioTimeout, fmt.Sprintf("/k%d", i), "/all"); err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			v, err := c.get(fmt.Sprintf("/k%d", i))
			if err == nil && v != fmt.Sprint(i) {
				err = fmt.Errorf("got %q", v)
			}
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
			}
		}()
	}
	eventually(t, "every wait is registered", func() bool { return s.Stats().Waiters == 2*n })
	setter := dial(t, addr, dialectV2)
	for i := range n {
		setter.set(fmt.Sprintf("/k%d", i), fmt.Sprint(i))
	}
	if s.Stats().Waiters != n {
		// The per-key sets are counted off; /all is still awaited by all.
		eventually(t, "one key left per waiter", func() bool { return s.Stats().Waiters == n })
	}
	setter.set("/all", "go")
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if w := s.Stats().Waiters; w != 0 {
		t.Fatalf("waiters = %d after every wait ended", w)
	}
}

// TestDisconnectMidWait: a client that goes away while waiting leaves no
// registration behind, and the server serves the others.
func TestDisconnectMidWait(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			s := startServer(t, Limits{})
			addr := s.Addr().String()
			quitter := dial(t, addr, d)
			quitter.send(opWait, keysArg([]string{"/x", "/y"}))
			stayer := dial(t, addr, d)
			done := make(chan error, 1)
			go func() { done <- stayer.wait(ioTimeout, "/x") }()
			eventually(t, "3 registrations", func() bool { return s.Stats().Waiters == 3 })
			quitter.nc.Close()
			eventually(t, "the quitter's registrations dropped", func() bool {
				st := s.Stats()
				return st.Waiters == 1 && st.Conns == 1
			})
			setter := dial(t, addr, d)
			setter.set("/x", "1")
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if st := s.Stats(); st.Waiters != 0 || st.Refused != 0 {
				t.Fatalf("stats = %+v", st)
			}
		})
	}
}

// TestLimits: each limit refuses the client that breaks it (its connection
// is closed, the refusal counted) while other clients are unaffected.
func TestLimits(t *testing.T) {
	lim := Limits{
		MaxKeyBytes:     16,
		MaxValueBytes:   64,
		MaxKeys:         4,
		MaxTotalBytes:   200,
		MaxWaiters:      3,
		MaxWaitsPerConn: 2,
		MaxKeysPerQuery: 3,
	}
	type limitCase struct {
		name  string
		setup func(c *wireClient) // queries that stay within the limits
		bad   func(c *wireClient)
	}
	// Cases that need other limits than lim.
	lims := map[string]Limits{
		// Room for the bytes of 3 registrations (64 + key each).
		"barrier past the waiter registrations": {MaxKeyBytes: 16, MaxValueBytes: 64, MaxKeys: 4,
			MaxTotalBytes: 1000, MaxWaiters: 3, MaxWaitsPerConn: 2, MaxKeysPerQuery: 3},
		// MaxWaiters allows the registrations; their bytes do not fit.
		"waits holding keys past the byte limit": {MaxKeyBytes: 16, MaxValueBytes: 64, MaxKeys: 4,
			MaxTotalBytes: 200, MaxWaiters: 100, MaxWaitsPerConn: 10, MaxKeysPerQuery: 3},
	}
	cases := []limitCase{
		{"key too long", nil, func(c *wireClient) { c.set(strings.Repeat("k", 17), "v") }},
		{"value too long", nil, func(c *wireClient) { c.set("/k", strings.Repeat("v", 65)) }},
		{"length prefix of 2^60 is not allocated", nil, func(c *wireClient) {
			c.sendRaw(append([]byte{c.code(opSet)}, append(str("/k"), u64(1<<60)...)...))
		}},
		{"key length of 2^63", nil, func(c *wireClient) { c.sendRaw(append([]byte{c.code(opGet)}, u64(1<<63)...)) }},
		{"too many keys named in one query", nil, func(c *wireClient) { c.send(opCheck, keysArg([]string{"a", "b", "c", "d"})) }},
		{"key count of 2^62", nil, func(c *wireClient) { c.send(opWait, u64(1<<62)) }},
		{"too many keys held", func(c *wireClient) {
			for i := range 3 { // and /good
				c.set(fmt.Sprintf("/k%d", i), "v")
			}
		}, func(c *wireClient) { c.set("/k4", "v") }},
		{"too many bytes held", func(c *wireClient) {
			c.set("/a", strings.Repeat("v", 60))
			c.set("/b", strings.Repeat("v", 60))
			c.set("/c", strings.Repeat("v", 60))
		}, func(c *wireClient) { c.set("/d", strings.Repeat("v", 60)) }},
		{"append past the value limit", func(c *wireClient) { c.appendTo("/a", strings.Repeat("v", 60)) },
			func(c *wireClient) { c.appendTo("/a", "12345") }},
		{"multi_set past the key limit", nil, func(c *wireClient) {
			c.multiSet("/1", "a", "/2", "b", "/3", "c")
			c.multiSet("/4", "a", "/5", "b")
		}},
		{"too many waits on one connection", func(c *wireClient) {
			c.send(opWait, keysArg([]string{"/w1"}))
			c.send(opWait, keysArg([]string{"/w2"}))
		}, func(c *wireClient) { c.send(opWait, keysArg([]string{"/w3"})) }},
		{"waits holding keys past the byte limit", func(c *wireClient) {
			// Each registration of a 16-byte key holds 16 + 64 bytes: two
			// and /good hold 166 of the 200.
			c.send(opWait, keysArg([]string{strings.Repeat("a", 16)}))
			c.send(opWait, keysArg([]string{strings.Repeat("b", 16)}))
		}, func(c *wireClient) { c.send(opWait, keysArg([]string{strings.Repeat("c", 16)})) }},
		{"too many waiter registrations", func(c *wireClient) {
			c.send(opWait, keysArg([]string{"/w1", "/w2"}))
		}, func(c *wireClient) { c.send(opWait, keysArg([]string{"/w3", "/w4"})) }},
	}
	v2Cases := []limitCase{
		{"barrier past the key limit", func(c *wireClient) {
			for i := range 3 { // and /good
				c.set(fmt.Sprintf("/k%d", i), "v")
			}
		}, func(c *wireClient) { c.sendBarrier("/bar", 2) }},
		{"barrier past the waits of one connection", func(c *wireClient) {
			c.send(opWait, keysArg([]string{"/w1"}))
			c.sendBarrier("/bar", 5)
		}, func(c *wireClient) { c.sendBarrier("/bar", 5) }},
		{"barrier past the waiter registrations", func(c *wireClient) {
			c.send(opWait, keysArg([]string{"a", "b", "c"}))
		}, func(c *wireClient) { c.sendBarrier("/bar", 5) }},
	}
	for _, d := range dialects {
		dcases := cases
		if d == dialectV2 {
			dcases = append(slices.Clip(cases), v2Cases...)
		}
		for _, tc := range dcases {
			t.Run(d.String()+"/"+tc.name, func(t *testing.T) {
				l, ok := lims[tc.name]
				if !ok {
					l = lim
				}
				s := startServer(t, l)
				addr := s.Addr().String()
				good := dial(t, addr, d)
				good.set("/good", "1")
				must[int64](t)(good.numKeys()) // a round trip: /good is held
				c := dial(t, addr, d)
				if tc.setup != nil {
					tc.setup(c)
					if must[int64](t)(c.numKeys()) < 0 { // a round trip: the setup was accepted
						t.Fatal("negative key count")
					}
				}
				tc.bad(c)
				c.expectClosed()
				eventually(t, "the refusal is counted", func() bool { return s.Stats().Refused == 1 })
				if v := must[string](t)(good.get("/good")); v != "1" {
					t.Fatalf("other client's get = %q", v)
				}
				eventually(t, "the refused client's waits are gone", func() bool { return s.Stats().Waiters == 0 })
			})
		}
	}
}

// TestInflightListOverhead: the keys and pairs of a list query are charged to
// the bytes reserved for queries being received even when they are empty, so
// connections that stall half-way through a MULTI_SET of empty pairs cannot
// hold memory past MaxTotalBytes for free.
func TestInflightListOverhead(t *testing.T) {
	const limit = 1 << 20
	s := startServer(t, Limits{MaxTotalBytes: limit, MessageTimeout: time.Hour})
	addr := s.Addr().String()
	good := dial(t, addr, dialectV2)

	// A whole MULTI_SET of 2,000 pairs (250 KiB charged) is served.
	var kv []string
	for i := range 2000 {
		kv = append(kv, fmt.Sprint(i), "")
	}
	good.multiSet(kv...)
	if n := must[int64](t)(good.numKeys()); n != 2000 {
		t.Fatalf("num keys = %d, want 2000", n)
	}
	if r := s.inflight.Load(); r != 0 {
		t.Fatalf("%d bytes still reserved after the query", r)
	}

	// 8 connections each announce 128 Ki empty pairs, send 2 Ki of them
	// (32 KiB on the wire, 256 KiB charged) and stall.
	const conns, pairs = 8, 2048
	part := append([]byte{good.code(opMultiSet)}, u64(128<<10)...)
	for range pairs {
		part = append(part, concat(str(""), str(""))...)
	}
	var stalled []*wireClient
	for range conns {
		c := dial(t, addr, dialectV2)
		_ = c.nc.SetWriteDeadline(time.Now().Add(ioTimeout))
		_, _ = c.nc.Write(part) // may fail: the server can close it first
		stalled = append(stalled, c)
	}
	// At most limit / 256 KiB = 4 of them fit.
	eventually(t, "the connections past the limit are refused", func() bool { return s.Stats().Refused >= conns-4 })
	if r := s.inflight.Load(); r > limit {
		t.Fatalf("%d bytes reserved, over the limit of %d", r, limit)
	}
	if n := must[uint32](t)(good.ping(9)); n != 9 {
		t.Fatalf("ping = %d", n)
	}
	for _, c := range stalled {
		c.nc.Close()
	}
	eventually(t, "every reservation released", func() bool { return s.inflight.Load() == 0 })
}

// TestTooManyConnections: the connection past MaxConns is closed at once;
// once one leaves, a new one is served.
func TestTooManyConnections(t *testing.T) {
	s := startServer(t, Limits{MaxConns: 3})
	addr := s.Addr().String()
	var cs []*wireClient
	for range 3 {
		c := dial(t, addr, dialectV2)
		cs = append(cs, c)
	}
	eventually(t, "3 connections", func() bool { return s.Stats().Conns == 3 })
	extra := dialRaw(t, addr, dialectV2)
	extra.expectClosed()
	eventually(t, "the refusal is counted", func() bool { return s.Stats().Refused == 1 })
	cs[0].set("/still", "served")
	if v := must[string](t)(cs[1].get("/still")); v != "served" {
		t.Fatalf("get = %q", v)
	}
	cs[2].nc.Close()
	eventually(t, "the leaver is gone", func() bool { return s.Stats().Conns == 2 })
	late := dial(t, addr, dialectV2)
	if v := must[string](t)(late.get("/still")); v != "served" {
		t.Fatalf("late get = %q", v)
	}
}

// TestSlowClients: a client that stops half-way through a query, or does not
// read the replies it asks for, is closed after MessageTimeout; an idle
// client between queries is not.
func TestSlowClients(t *testing.T) {
	testenv.SkipShort(t, "waits on real handshake and write deadlines")
	s := startServer(t, Limits{MessageTimeout: 300 * time.Millisecond, MaxKeysPerQuery: 1 << 20})
	addr := s.Addr().String()
	idle := dial(t, addr, dialectV2)

	half := dial(t, addr, dialectV2)
	half.sendRaw(append([]byte{half.code(opSet)}, u64(10)...)) // then nothing
	half.expectClosed()

	// Ask for ~64 MiB of replies and never read them.
	deaf := dial(t, addr, dialectV2)
	deaf.set("/big", strings.Repeat("v", 1<<20))
	q := append([]byte{deaf.code(opMultiGet)}, keysArg(repeat("/big", 64))...)
	deaf.sendRaw(q)
	eventually(t, "both refused", func() bool { return s.Stats().Refused == 2 })
	deaf.expectClosed()                // reads what was sent before the deadline, then the close
	time.Sleep(400 * time.Millisecond) // longer than MessageTimeout, idle
	if n := must[uint32](t)(idle.ping(7)); n != 7 {
		t.Fatalf("idle client's ping = %d", n)
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestNotificationOverflow: a watcher that never reads its updates is
// refused instead of growing a queue.
func TestNotificationOverflow(t *testing.T) {
	s := startServer(t, Limits{MessageTimeout: time.Hour})
	addr := s.Addr().String()
	w := dial(t, addr, dialectLegacy)
	w.send(opWatchKey, str("/hot"))
	setter := dial(t, addr, dialectLegacy)
	val := strings.Repeat("v", 64<<10)
	// Enough updates to fill the socket buffers and then the queue.
	for range 4 * (DefaultLimits().MaxWaitsPerConn + notifySlack) {
		setter.set("/hot", val)
		if s.Stats().Refused > 0 {
			break
		}
	}
	eventually(t, "the deaf watcher is refused", func() bool { return s.Stats().Refused == 1 })
	w.expectClosed()
	if v := must[string](t)(setter.get("/hot")); v != val {
		t.Fatal("setter's get returned another value")
	}
}

// TestQueuedBytesBounded: watch updates carry a key's old and new values,
// so a watcher that does not read could make the server hold up to 80 of
// them (gigabytes with large values) before the message count refuses it.
// The queued bytes are bounded per connection and for all connections
// together; the refused watcher's bytes are released, and a watcher that
// reads keeps working.
func TestQueuedBytesBounded(t *testing.T) {
	const val = 256 << 10 // one update: about 512 KiB (old and new)
	for _, tc := range []struct {
		name             string
		perConn, allConn int64
		deaf             int // watchers that never read
	}{
		{"one connection's bound", 2 << 20, 64 << 20, 1},
		{"every connection's bound", 64 << 20, 3 << 20, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, Limits{MessageTimeout: time.Hour, MaxQueuedBytesPerConn: tc.perConn, MaxQueuedBytes: tc.allConn})
			addr := s.Addr().String()
			var deaf []*wireClient
			for range tc.deaf {
				w := dial(t, addr, dialectLegacy)
				w.send(opWatchKey, str("/hot"))
				deaf = append(deaf, w)
			}
			setter := dial(t, addr, dialectLegacy)
			v := strings.Repeat("v", val)
			peak := int64(0)
			// Updates enough to fill the sockets' buffers (a few MiB on
			// loopback) and then the bound, but far fewer than 80 queued
			// messages of 512 KiB would need to pass it.
			for i := 0; i < 200 && s.Stats().Refused == 0; i++ {
				setter.set("/hot", v+strconv.Itoa(i%2))
				if _, err := setter.get("/hot"); err != nil { // the SET was served
					t.Fatal(err)
				}
				peak = max(peak, s.Stats().Queued)
			}
			eventually(t, "a deaf watcher is refused", func() bool { return s.Stats().Refused >= 1 })
			if bound := min(tc.perConn*int64(tc.deaf), tc.allConn); peak > bound {
				t.Fatalf("queued %d bytes at the peak, over the bound %d", peak, bound)
			}
			for _, w := range deaf {
				w.nc.Close()
			}
			eventually(t, "the queued bytes are released", func() bool { return s.Stats().Queued == 0 })
			// A watcher that reads is served.
			r := dial(t, addr, dialectLegacy)
			r.send(opWatchKey, str("/hot"))
			if b := must[byte](t)(r.readByte()); b != watchKeyCallbackRegistered {
				t.Fatalf("watch registration answered %d", b)
			}
			setter.set("/hot", "small")
			if ev := must[watchEvent](t)(r.readWatchEvent()); ev.kind != watchKeyUpdated || ev.new != "small" {
				t.Fatalf("watch update %+v", ev)
			}
		})
	}
}

// TestRegsPerConn: one connection cannot take every waiter slot with a few
// WAITs on many keys (or watches); a key named twice in one WAIT is
// registered once; other connections still wait.
func TestRegsPerConn(t *testing.T) {
	s := startServer(t, Limits{MaxRegsPerConn: 100, MaxWaiters: 150, MaxKeysPerQuery: 1000})
	addr := s.Addr().String()
	keys := func(prefix string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = prefix + strconv.Itoa(i)
		}
		return out
	}
	greedy := dial(t, addr, dialectV2)
	greedy.send(opWait, keysArg(keys("/a", 60)))
	eventually(t, "60 registrations", func() bool { return s.Stats().Waiters == 60 })
	greedy.send(opWait, keysArg(repeat("/dup", 500))) // one registration
	eventually(t, "61 registrations", func() bool { return s.Stats().Waiters == 61 })
	greedy.send(opWait, keysArg(keys("/b", 40))) // 101 > 100
	greedy.expectClosed()
	eventually(t, "refused, its registrations dropped", func() bool {
		st := s.Stats()
		return st.Refused == 1 && st.Waiters == 0
	})

	legacy := dial(t, addr, dialectLegacy) // watches count too
	for _, k := range keys("/w", 100) {
		legacy.send(opWatchKey, str(k))
		if b := must[byte](t)(legacy.readByte()); b != watchKeyCallbackRegistered {
			t.Fatalf("watch registration answered %d", b)
		}
	}
	eventually(t, "100 watches", func() bool { return s.Stats().Waiters == 100 })
	legacy.send(opWatchKey, str("/w-one-more"))
	legacy.expectClosed()
	eventually(t, "refused", func() bool { return s.Stats().Refused == 2 && s.Stats().Waiters == 0 })

	// Another client still waits and is answered.
	a, b := dial(t, addr, dialectV2), dial(t, addr, dialectV2)
	done := make(chan error, 1)
	go func() { done <- a.wait(20*time.Second, keys("/c", 90)...) }()
	eventually(t, "90 registrations", func() bool { return s.Stats().Waiters == 90 })
	b.multiSet(func() []string {
		var kv []string
		for _, k := range keys("/c", 90) {
			kv = append(kv, k, "x")
		}
		return kv
	}()...)
	if err := <-done; err != nil {
		t.Fatalf("wait: %v", err)
	}
}

// TestReset: keys dropped, waiters and connections closed, new clients see
// an empty store.
func TestReset(t *testing.T) {
	s := startServer(t, Limits{})
	addr := s.Addr().String()
	c := dial(t, addr, dialectLegacy)
	c.set("/worker/attempt_0/k", "old")
	must[string](t)(c.get("/worker/attempt_0/k")) // served: c vouches for one silent connection
	c2 := dial(t, addr, dialectLegacy)
	must[int64](t)(c2.add("init/", 1)) // and c2 for another
	waiter := dial(t, addr, dialectV2)
	waiter.send(opWait, keysArg([]string{"/never"}))
	watcher := dial(t, addr, dialectLegacy)
	watcher.send(opWatchKey, str("/worker/attempt_0/k"))
	must[byte](t)(watcher.readByte())
	eventually(t, "registrations", func() bool { return s.Stats().Waiters == 2 })

	silent := dialRaw(t, addr, dialectLegacy) // a 1.13 callback connection: never sends anything
	eventually(t, "5 connections", func() bool { return s.Stats().Conns == 5 })

	s.Reset()

	// The callback connections (only WATCH_KEY, or nothing) are retired,
	// not closed: closing them makes 1.13's listener thread spin.
	if st := s.Stats(); st.Keys != 0 || st.Bytes != 0 || st.Conns != 2 || st.Waiters != 0 {
		t.Fatalf("stats after Reset = %+v", st)
	}
	waiter.expectClosed()
	c.expectClosed()
	c2.expectClosed()
	fresh := dial(t, addr, dialectV2)
	if must[bool](t)(fresh.check("/worker/attempt_0/k")) {
		t.Fatal("a key of the old attempt is visible after Reset")
	}
	if n := must[int64](t)(fresh.numKeys()); n != 0 {
		t.Fatalf("num keys = %d", n)
	}
	// The retired watcher hears nothing of the new attempt, even on the key
	// it watched, and a new watch of it never fires.
	fresh.set("/worker/attempt_0/k", "new")
	watcher.send(opWatchKey, str("/worker/attempt_0/k"))
	if b := must[byte](t)(watcher.readByte()); b != watchKeyCallbackRegistered {
		t.Fatalf("retired watcher's registration answered %d", b)
	}
	fresh.set("/worker/attempt_0/k", "newer")
	watcher.expectSilent(300 * time.Millisecond)
	// Any other query closes a retired connection: an older attempt's
	// client never reads or writes the new attempt's keys.
	silent.send(opGet, str("/worker/attempt_0/k"))
	silent.expectClosed()
	watcher.set("/worker/attempt_0/k", "from the old attempt")
	watcher.expectClosed()
	if v := must[string](t)(fresh.get("/worker/attempt_0/k")); v != "newer" {
		t.Fatalf("value %q after the old attempt's SET", v)
	}
	if r := s.Stats().Refused; r != 0 {
		t.Fatalf("Reset counted %d refusals", r)
	}
	eventually(t, "only the fresh connection", func() bool { return s.Stats().Conns == 1 && s.Stats().Waiters == 0 })
}

// TestResetMemoryBounded: thousands of attempts, each leaving keys, waiters
// and connections behind, do not grow the server.
func TestResetMemoryBounded(t *testing.T) {
	testenv.SkipShort(t, "repeats a race or a load many times")
	s := startServer(t, Limits{})
	addr := s.Addr().String()
	attempt := func(i int) {
		// Not dial: its cleanup would keep every test-side connection alive
		// until the test ends and blur the measurement.
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		c := &wireClient{t: t, nc: nc, br: bufio.NewReader(nc), d: dialectV2}
		c.handshake()
		for k := range 8 {
			c.set(fmt.Sprintf("/attempt_%d/key%d", i, k), strings.Repeat("v", 512))
		}
		must[int64](t)(c.add("init/", 1))
		c.send(opWait, keysArg([]string{fmt.Sprintf("/attempt_%d/never", i)}))
		must[int64](t)(c.numKeys()) // round trip: everything above was served
		s.Reset()
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for i := range 200 {
		attempt(i)
	}
	base := heap()
	const n = 3000
	for i := range n {
		attempt(200 + i)
	}
	after := heap()
	if st := s.Stats(); st.Keys != 0 || st.Bytes != 0 || st.Conns != 0 || st.Waiters != 0 {
		t.Fatalf("stats after %d resets = %+v", n, st)
	}
	// Each attempt stored ~4.5 KiB; kept, 3000 of them would be ~13 MiB.
	if after > base+1<<20 {
		t.Fatalf("heap grew from %d to %d bytes over %d resets", base, after, n)
	}
	t.Logf("heap %d -> %d bytes over %d resets", base, after, n)
}

// TestCloseIdempotentNoLeak: Close twice, with clients connected and waiting,
// leaves no goroutine behind; cancelling Listen's context closes too.
func TestCloseIdempotentNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, viaCtx := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := Listen(ctx, "127.0.0.1:0", Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		addr := s.Addr().String()
		for i := range 5 {
			c := dial(t, addr, dialects[i%2])
			c.send(opWait, keysArg([]string{"/never"}))
		}
		eventually(t, "5 waiters", func() bool { return s.Stats().Waiters == 5 })
		if viaCtx {
			cancel()
			eventually(t, "the listener closes", func() bool {
				c, err := net.Dial("tcp", addr)
				if err == nil {
					c.Close()
				}
				return err != nil
			})
		}
		for range 2 {
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		}
		cancel()
		if _, err := net.Dial("tcp", addr); err == nil {
			t.Fatal("still accepting after Close")
		}
	}
	eventually(t, "goroutines back to where they were", func() bool {
		return runtime.NumGoroutine() <= before
	})
}

// TestListenErrors: a bad address names the problem.
func TestListenErrors(t *testing.T) {
	s := startServer(t, Limits{})
	for _, addr := range []string{"not-an-address", s.Addr().String()} {
		_, err := Listen(context.Background(), addr, Options{})
		if err == nil || !strings.Contains(err.Error(), addr) {
			t.Errorf("Listen(%q) = %v, want an error naming the address", addr, err)
		}
	}
}

// recorder is a slog.Handler that keeps each record as one line of text
// ("message key=value ..."), for tests that count what was logged.
type recorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	r.mu.Lock()
	r.lines = append(r.lines, line)
	r.mu.Unlock()
	return nil
}

func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}

// TestRefusalLogRateLimited: a client refused in a loop is counted every
// time but logged a bounded number of times, with the count held back.
func TestRefusalLogRateLimited(t *testing.T) {
	var logs recorder
	s, err := Listen(context.Background(), "127.0.0.1:0", Options{
		Limits: Limits{MaxConns: 1},
		Logger: slog.New(&logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr := s.Addr().String()
	dial(t, addr, dialectV2) // holds the one connection
	eventually(t, "1 connection", func() bool { return s.Stats().Conns == 1 })
	const n = 200
	start := time.Now()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Read(make([]byte, 1)) // until the server closes it
		c.Close()
	}
	eventually(t, "every refusal counted", func() bool { return s.Stats().Refused == n })
	elapsed := time.Since(start)
	lines := strings.Count(logs.String(), "TCPStore client refused")
	if max := refusalBurst + int(elapsed/refusalEvery) + 1; lines > max || lines < refusalBurst {
		t.Fatalf("%d refusals in %v logged %d lines, want %d..%d", n, elapsed, lines, refusalBurst, max)
	}
	if lines > refusalBurst && !strings.Contains(logs.String(), "suppressed_since_last") {
		t.Fatal("a summary line does not say how many refusals it held back")
	}
	if !strings.Contains(logs.String(), "reason=too many connections") {
		t.Fatalf("log does not name the reason:\n%s", logs.String())
	}
}

// TestGarbageClients: connections that send random bytes (a port scanner,
// a confused client) are dropped without harming the server or its clients.
func TestGarbageClients(t *testing.T) {
	s := startServer(t, Limits{MessageTimeout: 500 * time.Millisecond})
	addr := s.Addr().String()
	good := dial(t, addr, dialectV2)
	good.set("/good", "1")
	rng := rand.New(rand.NewPCG(1, 2))
	var wg sync.WaitGroup
	for i := range 64 {
		junk := make([]byte, 1+rng.IntN(4096))
		for j := range junk {
			junk[j] = byte(rng.UintN(256))
		}
		if i%2 == 0 {
			junk[0] = 0 // half of them look like a SET or a VALIDATE at first
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			_, _ = c.Write(junk)
			_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
			_, _ = io.Copy(io.Discard, c) // until the server drops it
		}()
	}
	wg.Wait()
	eventually(t, "only the good client is left", func() bool {
		st := s.Stats()
		return st.Conns == 1 && st.Waiters == 0
	})
	if v := must[string](t)(good.get("/good")); v != "1" {
		t.Fatalf("good client's get = %q", v)
	}
	t.Logf("stats after the junk: %+v", s.Stats())
}

// TestResetRacesFirstQuery: a connection whose first query arrives as
// Reset runs is either closed (Reset saw it query) or retired before the
// query is served (and then closed by it): the query never reaches the
// retired state, which must hold nothing.
func TestResetRacesFirstQuery(t *testing.T) {
	testenv.SkipShort(t, "repeats a race or a load many times")
	s := startServer(t, Limits{})
	addr := s.Addr().String()
	for i := range 1500 {
		c := dialRaw(t, addr, dialectLegacy)
		eventually(t, "accepted", func() bool { return s.Stats().Conns >= 1 })
		q := concat([]byte{c.code(opSet)}, str("/k"+strconv.Itoa(i)), str("v"))
		done := make(chan struct{})
		go func() { _, _ = c.nc.Write(q); close(done) }() // may meet Reset's close
		s.Reset()
		<-done
		c.nc.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retired != nil && (len(s.retired.kv) != 0 || s.retired.waiters != 0) {
		t.Fatalf("the retired state holds %d keys and %d registrations", len(s.retired.kv), s.retired.waiters)
	}
}
