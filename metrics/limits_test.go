package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("count fds: %v", err)
	}
	return len(ents)
}

// scrape GETs /metrics on a new connection and checks the body.
func scrape(addr string) error {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("scrape body: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "ftlauncher_rounds_total") {
		return fmt.Errorf("scrape: status %d, %d bytes without ftlauncher_rounds_total", resp.StatusCode, len(b))
	}
	return nil
}

// TestIdleFlood: 1,500 connections to the metrics server, half
// never sending anything and half left idle after one keep-alive request,
// while a scraper scrapes every 100 ms. The server holds at most MaxConns
// of them at once, closes every one of them within the idle bounds without
// the client's help, releases their descriptors, and every scrape during
// the flood succeeds.
func TestIdleFlood(t *testing.T) {
	const flood = 1500
	lim := Limits{ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 5 * time.Second,
		IdleTimeout: time.Second, MaxConns: 64}
	m := New()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := newBoundedListener(ln, lim.MaxConns)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.serveListener(ctx, bl, lim) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	addr := ln.Addr().String()
	if err := scrape(addr); err != nil {
		t.Fatal(err)
	}
	fd0 := openFDs(t)

	// The scraper, during the whole flood.
	var (
		stop             = make(chan struct{})
		scrapes, failed  atomic.Int64
		slowest          atomic.Int64
		scraperDone      = make(chan struct{})
		firstScrapeError atomic.Value
	)
	go func() {
		defer close(scraperDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			start := time.Now()
			if err := scrape(addr); err != nil {
				failed.Add(1)
				firstScrapeError.CompareAndSwap(nil, err.Error())
			}
			scrapes.Add(1)
			if d := int64(time.Since(start)); d > slowest.Load() {
				slowest.Store(d)
			}
		}
	}()

	conns := make([]net.Conn, 0, flood)
	var mu sync.Mutex
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	start := time.Now()
	for i := 0; i < flood; i++ {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		if i%2 == 1 {
			// One keep-alive request (a cheap 404), then idle. The server
			// may already have closed it to make room: that is what it is for.
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, "GET /idle HTTP/1.1\r\nHost: flood\r\n\r\n"); err == nil {
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			_ = c.SetDeadline(time.Time{})
		}
	}
	flooded := time.Since(start)
	open, peak, evicted := bl.stats()
	fdFlood := openFDs(t)

	// Every flood connection is closed by the server: a read sees EOF or
	// a reset, never the client's own deadline.
	bound := lim.IdleTimeout + lim.ReadHeaderTimeout + 5*time.Second
	var closedBy time.Duration
	for i, c := range conns {
		_ = c.SetReadDeadline(start.Add(flooded + bound))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("flood connection %d still open %v after the flood", i, bound)
		}
		closedBy = max(closedBy, time.Since(start)-flooded)
	}
	close(stop)
	<-scraperDone
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	mu.Unlock()
	var fdAfter int
	deadline := time.Now().Add(10 * time.Second)
	for {
		fdAfter = openFDs(t)
		if o, _, _ := bl.stats(); (o == 0 && fdAfter <= fd0+2) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	openAfter, _, _ := bl.stats()

	t.Logf("%d connections in %v: %d open at the end of the flood, peak %d (cap %d), %d closed to make room; "+
		"all closed by the server %v after the flood; fds: %d before, %d during (clients' included), %d after; "+
		"%d scrapes during the flood, %d failed, slowest %v",
		flood, flooded.Round(time.Millisecond), open, peak, lim.MaxConns, evicted, closedBy.Round(time.Millisecond),
		fd0, fdFlood, fdAfter, scrapes.Load(), failed.Load(), time.Duration(slowest.Load()).Round(time.Millisecond))
	if peak > lim.MaxConns {
		t.Errorf("%d connections open at once, cap %d", peak, lim.MaxConns)
	}
	if evicted == 0 {
		t.Errorf("no connection was closed to make room during a flood of %d", flood)
	}
	if openAfter != 0 || fdAfter > fd0+2 {
		t.Errorf("after the flood: %d connections still open, %d fds (before: %d)", openAfter, fdAfter, fd0)
	}
	if scrapes.Load() == 0 || failed.Load() != 0 {
		t.Errorf("%d of %d scrapes during the flood failed (first: %v)", failed.Load(), scrapes.Load(), firstScrapeError.Load())
	}
	if err := scrape(addr); err != nil {
		t.Errorf("after the flood: %v", err)
	}
}

// TestBoundedListenerRefusesWhenAllBusy: when every slot serves a request,
// a newcomer is closed at once instead of waiting or evicting a request.
func TestBoundedListenerRefusesWhenAllBusy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := newBoundedListener(ln, 2)
	defer bl.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := bl.Accept()
			if err != nil {
				close(accepted)
				return
			}
			bl.connState(c, http.StateActive)
			accepted <- c
		}
	}()
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	for i := 0; i < 2; i++ {
		select {
		case <-accepted:
		case <-time.After(10 * time.Second):
			t.Fatalf("connection %d not accepted", i)
		}
	}
	// The third was accepted and closed: its client reads EOF.
	_ = clients[2].SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := clients[2].Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("third connection: read %v, want EOF", err)
	}
	select {
	case c := <-accepted:
		t.Errorf("a third connection was handed to the server: %v", c.RemoteAddr())
	default:
	}
	if open, peak, evicted := bl.stats(); open != 2 || peak != 2 || evicted != 0 {
		t.Errorf("open %d, peak %d, evicted %d; want 2, 2, 0", open, peak, evicted)
	}
}
