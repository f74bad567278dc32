package tcpstore

// The wire format, written from docs/protocol.md: every integer is
// little-endian (the byte order of the hosts torch runs on), a string or byte
// vector is a uint64 length followed by its bytes, and a query is one type
// byte followed by its arguments.

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
