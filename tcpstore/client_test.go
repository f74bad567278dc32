package tcpstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// wireClient encodes the TCPStore wire format as docs/protocol.md describes
// it, byte for byte the way torch's clients do.
//
// For the v2 dialect it is a STAND-IN for torch 2.x's client: torch 2.x
// cannot be installed on this machine (only Debian's torch 1.13 is), so the
// 2.x queries (VALIDATE, PING, APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT,
// QUEUE_*, LIST_KEYS, BARRIER) are written here from the wire format read in
// torch's TCPStore.cpp / TCPStoreLibUvBackend.cpp. The legacy dialect is also checked
// against the real torch 1.13 client in torch_test.go; this client adds the
// legacy queries 1.13's Python API cannot send (WATCH_KEY) and bad clients.
type wireClient struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
	d  dialect
}

const ioTimeout = 20 * time.Second

// dialRaw connects without any handshake.
func dialRaw(t testing.TB, addr string, d dialect) *wireClient {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { nc.Close() })
	return &wireClient{t: t, nc: nc, br: bufio.NewReader(nc), d: d}
}

// handshake does what torch's client does on connecting: a 2.x client
// validates and pings, a 1.13 client sends nothing until its first query.
func (c *wireClient) handshake() {
	c.t.Helper()
	if c.d == dialectV2 {
		c.send(opValidate, u32(validationMagic))
		if got, err := c.ping(0xBEEF); err != nil || got != 0xBEEF {
			c.t.Fatalf("ping after validate: got %#x, %v", got, err)
		}
	}
}

// dial connects the way torch's client does.
func dial(t testing.TB, addr string, d dialect) *wireClient {
	t.Helper()
	c := dialRaw(t, addr, d)
	c.handshake()
	return c
}

// code is the type byte of o in c's dialect.
func (c *wireClient) code(o op) byte {
	table := legacyOps
	if c.d == dialectV2 {
		table = v2Ops
	}
	for i, x := range table {
		if x == o {
			return byte(i)
		}
	}
	c.t.Fatalf("%s has no %s query", c.d, o)
	return 0
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func str(s string) []byte { return append(u64(uint64(len(s))), s...) }
func vec(b []byte) []byte { return append(u64(uint64(len(b))), b...) }

func (c *wireClient) send(o op, parts ...[]byte) {
	c.t.Helper()
	c.sendRaw(append([]byte{c.code(o)}, concat(parts...)...))
}

func (c *wireClient) sendRaw(b []byte) {
	c.t.Helper()
	_ = c.nc.SetWriteDeadline(time.Now().Add(ioTimeout))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func concat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func (c *wireClient) deadline(d time.Duration) { _ = c.nc.SetReadDeadline(time.Now().Add(d)) }

func (c *wireClient) readByte() (byte, error) {
	c.deadline(ioTimeout)
	return c.br.ReadByte()
}

func (c *wireClient) readU64() (uint64, error) {
	c.deadline(ioTimeout)
	var b [8]byte
	_, err := io.ReadFull(c.br, b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

func (c *wireClient) readVec() ([]byte, error) {
	n, err := c.readU64()
	if err != nil {
		return nil, err
	}
	if n > 1<<30 {
		return nil, fmt.Errorf("reply length %d", n)
	}
	b := make([]byte, n)
	_, err = io.ReadFull(c.br, b)
	return b, err
}

func (c *wireClient) set(key, val string) { c.send(opSet, str(key), str(val)) }

// get waits for the key first, as torch's client does.
func (c *wireClient) get(key string) (string, error) {
	if err := c.wait(ioTimeout, key); err != nil {
		return "", err
	}
	return c.getNoWait(key)
}

func (c *wireClient) getNoWait(key string) (string, error) {
	c.send(opGet, str(key))
	b, err := c.readVec()
	return string(b), err
}

func (c *wireClient) add(key string, delta int64) (int64, error) {
	c.send(opAdd, str(key), u64(uint64(delta)))
	v, err := c.readU64()
	return int64(v), err
}

func (c *wireClient) compareSet(key, expected, desired string) (string, error) {
	c.send(opCompareSet, str(key), str(expected), str(desired))
	b, err := c.readVec()
	return string(b), err
}

func keysArg(keys []string) []byte {
	b := u64(uint64(len(keys)))
	for _, k := range keys {
		b = append(b, str(k)...)
	}
	return b
}

func (c *wireClient) check(keys ...string) (bool, error) {
	c.send(opCheck, keysArg(keys))
	b, err := c.readByte()
	if err != nil {
		return false, err
	}
	switch b {
	case checkReady:
		return true, nil
	case checkNotReady:
		return false, nil
	}
	return false, fmt.Errorf("check reply %d", b)
}

var errWaitTimeout = errors.New("wait timed out")

// wait behaves like the client of its dialect: v2 cancels a timed-out wait
// and reads STOP_WAITING (if it crossed) then WAIT_CANCELED; 1.13 just gives
// up.
func (c *wireClient) wait(timeout time.Duration, keys ...string) error {
	c.send(opWait, keysArg(keys))
	c.deadline(timeout)
	b, err := c.br.ReadByte()
	if err == nil {
		if b != waitStopWaiting {
			return fmt.Errorf("wait reply %d, want STOP_WAITING", b)
		}
		return nil
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		return err
	}
	if c.d != dialectV2 {
		return errWaitTimeout
	}
	c.send(opCancelWait)
	if b, err = c.readByte(); err != nil {
		return err
	}
	if b == waitStopWaiting {
		if b, err = c.readByte(); err != nil {
			return err
		}
	}
	if b != waitCanceled {
		return fmt.Errorf("reply %d after CANCEL_WAIT, want WAIT_CANCELED", b)
	}
	return errWaitTimeout
}

func (c *wireClient) numKeys() (int64, error) {
	c.send(opNumKeys)
	v, err := c.readU64()
	return int64(v), err
}

func (c *wireClient) deleteKey(key string) (bool, error) {
	c.send(opDeleteKey, str(key))
	v, err := c.readU64()
	return v == 1, err
}

func (c *wireClient) appendTo(key, val string) { c.send(opAppend, str(key), str(val)) }

func (c *wireClient) multiGet(keys ...string) ([]string, error) {
	if err := c.wait(ioTimeout, keys...); err != nil {
		return nil, err
	}
	c.send(opMultiGet, keysArg(keys))
	out := make([]string, len(keys))
	for i := range keys {
		b, err := c.readVec()
		if err != nil {
			return nil, err
		}
		out[i] = string(b)
	}
	return out, nil
}

func (c *wireClient) multiSet(kv ...string) {
	b := u64(uint64(len(kv) / 2))
	for i := 0; i < len(kv); i += 2 {
		b = append(b, str(kv[i])...)
		b = append(b, str(kv[i+1])...)
	}
	c.send(opMultiSet, b)
}

func (c *wireClient) ping(nonce uint32) (uint32, error) {
	c.send(opPing, u32(nonce))
	c.deadline(ioTimeout)
	var b [4]byte
	_, err := io.ReadFull(c.br, b[:])
	return binary.LittleEndian.Uint32(b[:]), err
}

func (c *wireClient) queuePush(key, val string) { c.send(opQueuePush, str(key), str(val)) }

// queuePop blocks until the queue has an item when block is set, like
// torch's queue_pop(block=True).
func (c *wireClient) queuePop(key string, block bool) (string, bool, error) {
	if block {
		if err := c.wait(ioTimeout, key); err != nil {
			return "", false, err
		}
	}
	c.send(opQueuePop, str(key))
	n, err := c.readU64()
	if err != nil || n == 0 {
		return "", false, err
	}
	b, err := c.readVec()
	return string(b), true, err
}

func (c *wireClient) queueLen(key string) (int64, error) {
	c.send(opQueueLen, str(key))
	v, err := c.readU64()
	return int64(v), err
}

func (c *wireClient) listKeys() ([]string, error) {
	c.send(opListKeys)
	n, err := c.readU64()
	if err != nil {
		return nil, err
	}
	if n > 1<<20 {
		return nil, fmt.Errorf("LIST_KEYS count %d", n)
	}
	keys := make([]string, 0, n)
	for range n {
		b, err := c.readVec()
		if err != nil {
			return nil, err
		}
		keys = append(keys, string(b))
	}
	return keys, nil
}

// sendBarrier sends BARRIER; its STOP_WAITING comes when worldSize clients
// have arrived.
func (c *wireClient) sendBarrier(key string, worldSize int64) {
	c.send(opBarrier, str(key), u64(uint64(worldSize)))
}

// expectSilent asserts that nothing arrives on the connection for d.
func (c *wireClient) expectSilent(d time.Duration) {
	c.t.Helper()
	c.deadline(d)
	b, err := c.br.Peek(1)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		c.t.Fatalf("got %v, %v within %v, want nothing", b, err, d)
	}
}

// watchEvent is one update a legacy server sends a WATCH_KEY connection.
type watchEvent struct {
	kind     byte
	key      string
	old, new string
}

func (c *wireClient) readWatchEvent() (watchEvent, error) {
	var ev watchEvent
	var err error
	if ev.kind, err = c.readByte(); err != nil {
		return ev, err
	}
	var b []byte
	if b, err = c.readVec(); err != nil {
		return ev, err
	}
	ev.key = string(b)
	if b, err = c.readVec(); err != nil {
		return ev, err
	}
	ev.old = string(b)
	b, err = c.readVec()
	ev.new = string(b)
	return ev, err
}

// expectClosed asserts the server closed the connection (EOF or reset), not
// merely stayed silent.
func (c *wireClient) expectClosed() {
	c.t.Helper()
	c.deadline(ioTimeout)
	buf := make([]byte, 64)
	for {
		_, err := c.br.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			c.t.Fatalf("connection still open after %v, want it closed by the server", ioTimeout)
		}
		return
	}
}
