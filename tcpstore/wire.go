package tcpstore

// The wire format, written from docs/protocol.md: every integer is
// little-endian (the byte order of the hosts torch runs on), a string or byte
// vector is a uint64 length followed by its bytes, and a query is one type
// byte followed by its arguments.

import (
	"bufio"
	"encoding/binary"
	"io"
)

// op is a query, independent of the number a dialect gives it.
type op uint8

const (
	opInvalid op = iota
	opValidate
	opSet
	opCompareSet
	opGet
	opAdd
	opCheck
	opWait
	opNumKeys
	opWatchKey
	opDeleteKey
	opAppend
	opMultiGet
	opMultiSet
	opCancelWait
	opPing
	opQueuePush
	opQueuePop
	opQueueLen
	opListKeys
	opBarrier
)

var opNames = [...]string{
	opInvalid:    "INVALID",
	opValidate:   "VALIDATE",
	opSet:        "SET",
	opCompareSet: "COMPARE_SET",
	opGet:        "GET",
	opAdd:        "ADD",
	opCheck:      "CHECK",
	opWait:       "WAIT",
	opNumKeys:    "GETNUMKEYS",
	opWatchKey:   "WATCH_KEY",
	opDeleteKey:  "DELETE_KEY",
	opAppend:     "APPEND",
	opMultiGet:   "MULTI_GET",
	opMultiSet:   "MULTI_SET",
	opCancelWait: "CANCEL_WAIT",
	opPing:       "PING",
	opQueuePush:  "QUEUE_PUSH",
	opQueuePop:   "QUEUE_POP",
	opQueueLen:   "QUEUE_LEN",
	opListKeys:   "LIST_KEYS",
	opBarrier:    "BARRIER",
}

func (o op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "INVALID"
}

// dialect is the client generation a connection speaks.
type dialect uint8

const (
	dialectUnknown dialect = iota
	dialectLegacy          // torch 1.13 and 2.0: no handshake, SET = 0
	dialectV2              // torch 2.2 and later: VALIDATE = 0 handshake first
)

func (d dialect) String() string {
	switch d {
	case dialectLegacy:
		return "legacy"
	case dialectV2:
		return "v2"
	}
	return "unknown"
}

// legacyOps numbers the queries of torch 1.13 (SET .. DELETE_KEY) and the
// ones torch 2.0 appended (APPEND .. CANCEL_WAIT). The 2.1-era numbering,
// which dropped WATCH_KEY (DELETE_KEY = 7 .. CANCEL_WAIT = 11) before the
// handshake came, is not served; see conn.handle's WATCH_KEY.
var legacyOps = []op{
	opSet, opCompareSet, opGet, opAdd, opCheck, opWait, opNumKeys, opWatchKey,
	opDeleteKey, opAppend, opMultiGet, opMultiSet, opCancelWait,
}

// v2Ops numbers the queries of torch 2.2 and later; WATCH_KEY is gone.
// LIST_KEYS and BARRIER are the newest (pytorch's libuv backend of 2025-2026,
// shipped by torch 2.11).
var v2Ops = []op{
	opValidate, opSet, opCompareSet, opGet, opAdd, opCheck, opWait, opNumKeys,
	opDeleteKey, opAppend, opMultiGet, opMultiSet, opCancelWait, opPing,
	opQueuePush, opQueuePop, opQueueLen, opListKeys, opBarrier,
}

func (d dialect) op(b byte) op {
	var table []op
	switch d {
	case dialectLegacy:
		table = legacyOps
	case dialectV2:
		table = v2Ops
	}
	if int(b) < len(table) {
		return table[b]
	}
	return opInvalid
}

// validationMagic is the uint32 a torch 2.2+ client sends after VALIDATE.
const validationMagic uint32 = 0x3C85F7CE

// Reply bytes.
const (
	checkReady    byte = 0
	checkNotReady byte = 1

	waitStopWaiting byte = 0
	waitCanceled    byte = 1

	watchKeyUpdated            byte = 0
	watchKeyCreated            byte = 1
	watchKeyDeleted            byte = 2
	watchKeyCallbackRegistered byte = 3
	watchKeyAppended           byte = 4
)

// The encoding on a connection: a query's arguments read within the
// limits (their bytes reserved), and replies written.

func (c *conn) readU64() (uint64, error) {
	var b [8]byte
	if _, err := io.ReadFull(c.br, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (c *conn) readU32() (uint32, error) {
	var b [4]byte
	if _, err := io.ReadFull(c.br, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// readVec reads a length-prefixed byte vector of at most max bytes; the
// length is checked, and the bytes reserved, before anything is allocated.
func (c *conn) readVec(max int, what string) ([]byte, error) {
	n, err := c.readU64()
	if err != nil {
		return nil, err
	}
	if n > uint64(max) {
		return nil, refusef("%s of %d bytes exceeds the limit of %d bytes", what, n, max)
	}
	if err := c.reserve(int64(n)); err != nil {
		return nil, err
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(c.br, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

func (c *conn) readKey() (string, error) {
	b, err := c.readVec(c.s.lim.MaxKeyBytes, "key")
	return string(b), err
}

func (c *conn) readValue() ([]byte, error) {
	return c.readVec(c.s.lim.MaxValueBytes, "value")
}

// readKeyValue reads the (key, value) pair of SET, APPEND, QUEUE_PUSH and
// each MULTI_SET entry.
func (c *conn) readKeyValue() (string, []byte, error) {
	key, err := c.readKey()
	if err != nil {
		return "", nil, err
	}
	val, err := c.readValue()
	return key, val, err
}

func (c *conn) readCount() (int, error) {
	n, err := c.readU64()
	if err != nil {
		return 0, err
	}
	if n > uint64(c.s.lim.MaxKeysPerQuery) {
		return 0, refusef("query names %d keys, over the limit of %d", n, c.s.lim.MaxKeysPerQuery)
	}
	return int(n), nil
}

func (c *conn) readKeys() ([]string, error) {
	n, err := c.readCount()
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, min(n, 1024))
	for range n {
		if err := c.reserve(listItemCost); err != nil {
			return nil, err
		}
		k, err := c.readKey()
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func (c *conn) replyVec(v []byte) error {
	return c.write(func(w *bufio.Writer) {
		writeVec(w, v)
	})
}

func (c *conn) replyI64(v int64) error {
	return c.write(func(w *bufio.Writer) { writeU64(w, uint64(v)) })
}

func (c *conn) replyByte(b byte) error {
	return c.write(func(w *bufio.Writer) { _ = w.WriteByte(b) })
}

// writeVec writes a string or byte vector: its uint64 length, then its bytes.
func writeVec[T string | []byte](w *bufio.Writer, v T) {
	writeU64(w, uint64(len(v)))
	switch x := any(v).(type) { // no copy of a value into a string
	case string:
		_, _ = w.WriteString(x)
	case []byte:
		_, _ = w.Write(x)
	}
}

func writeU64(w *bufio.Writer, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	_, _ = w.Write(b[:])
}
