// Package ftwire defines ft-launcher's native rank-monitor protocol (FTL1):
// the constants, message payloads and small encode/decode helpers shared by
// the monitor (server) and the Go client. docs/protocol.md is the normative
// description; this package is its executable form.
//
// A connection starts with the 4-byte magic "FTL1" (the last byte is the
// protocol version). Each message is one type byte; types below 0x40 have a
// fixed layout of zero or more unsigned varints (the hot path: a heartbeat is
// the single byte 0x01), types 0x40..0x7f carry a uvarint length and that
// many payload bytes (JSON), so a reader can skip a length-prefixed type it
// does not know.
package ftwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Magic opens every native connection, from the client and in the server's
// first reply. Its first byte ('F') can never start an nvrx frame, whose
// first byte is the high byte of a big-endian length (0x00 for any frame
// under 16 MiB).
const Magic = "FTL1"

// Version is the protocol version carried in Magic's last byte.
const Version = 1

// ProtocolEnv is set for every rank beside FT_RANK_MONITOR_IPC_SOCKET, to
// Protocol: nvidia-resiliency-ext's ft_launcher sets the socket variable
// too, for a monitor that speaks pickle frames and would leave a native
// handshake unanswered, so native clients check this first.
const (
	ProtocolEnv = "FT_RANK_MONITOR_PROTOCOL"
	Protocol    = "ftl1"
)

// MaxPayload bounds a length-prefixed payload.
const MaxPayload = 1 << 20

// Fixed-layout message types (client to server, fire-and-forget).
const (
	MsgHeartbeat       byte = 0x01 // no fields
	MsgSectionOpen     byte = 0x02 // uvarint section id
	MsgSectionClose    byte = 0x03 // uvarint section id
	MsgSectionCloseAll byte = 0x04 // no fields
	MsgSectionOpenIter byte = 0x05 // uvarint section id, uvarint iteration
)

// Length-prefixed message types.
const (
	MsgHello           byte = 0x40 // C→S JSON Hello; must be the first message
	MsgConfig          byte = 0x41 // S→C JSON ServerConfig; the reply to Hello
	MsgDefineSection   byte = 0x42 // C→S uvarint id followed by the section name bytes
	MsgSetTimeouts     byte = 0x43 // C→S JSON TimeoutsUpdate; no reply
	MsgWorkloadRequest byte = 0x44 // C→S (launcher socket) JSON WorkloadRequest
	MsgAck             byte = 0x45 // S→C JSON Ack; reply to MsgWorkloadRequest
	MsgRejoin          byte = 0x46 // S→C JSON Rejoin: an in-process restart's notice (docs/inprocess.md)
	MsgInProcessReport byte = 0x47 // C→S JSON InProcessReport: a survivor rejoined / took its first step
)

// LengthPrefixed reports whether messages of type t carry a uvarint length.
func LengthPrefixed(t byte) bool { return t >= 0x40 && t < 0x80 }

// Hello is the first message of a rank connection. Fields are optional;
// unknown fields are ignored by the server.
type Hello struct {
	GlobalRank     int    `json:"global_rank"`
	LocalRank      int    `json:"local_rank"`
	PID            int    `json:"pid"`
	Host           string `json:"host,omitempty"`
	Iteration      *int64 `json:"iteration,omitempty"`
	NumWarmupIters *int64 `json:"num_warmup_iters,omitempty"`
	Client         string `json:"client,omitempty"` // e.g. "ftclient-go/1", "ft_launcher_client-py/1"
	// Shm asks for a shared-memory heartbeat region (its layout is
	// internal/ftshm). A server that grants it sets ServerConfig.Shm and attaches the
	// region's fd (SCM_RIGHTS) to the first byte of its reply.
	Shm bool `json:"shm,omitempty"`
	// ShmSections asks for the section-event ring in the shared region
	// (with Shm). A server that grants it sets ServerConfig.ShmSections;
	// the client must then send every section event through the ring.
	ShmSections bool `json:"shm_sections,omitempty"`
	// InProcess registers the rank as able to restart in process
	// (--restart-mode in-process): it reads MsgRejoin notices after Config.
	InProcess bool `json:"inprocess,omitempty"`
}

// Rejoin is the payload of MsgRejoin: leave the current process group and
// join round Round's, at the launcher's store under StorePrefix, as Rank
// of WorldSize.
type Rejoin struct {
	Round       int    `json:"round"`
	Rank        int    `json:"rank"`
	LocalRank   int    `json:"local_rank"`
	WorldSize   int    `json:"world_size"`
	MasterAddr  string `json:"master_addr"`
	MasterPort  int    `json:"master_port"`
	StorePrefix string `json:"store_prefix"`
	Reason      string `json:"reason,omitempty"`
	// DeadlineS is the rejoin bound in seconds (--inprocess-rejoin-timeout).
	DeadlineS float64 `json:"deadline_s"`
}

// InProcessReport is the payload of MsgInProcessReport. Phase is
// "rejoined" (the new process group is up) or "first_step" (the first
// training step of the round ended); durations are seconds measured by
// the rank (0 when not yet known).
type InProcessReport struct {
	Round      int     `json:"round"`
	Phase      string  `json:"phase"`
	TeardownS  float64 `json:"teardown_s"`
	RejoinS    float64 `json:"rejoin_s"`
	RestoreS   float64 `json:"restore_s"`
	FirstStepS float64 `json:"first_step_s"`
}

// ServerConfig is the server's reply to Hello: the effective timeouts and
// the fault-tolerance settings a client needs. Timeouts are seconds; null
// means disabled. Field names follow nvrx's FaultToleranceConfig.
type ServerConfig struct {
	Protocol                    int                 `json:"protocol"`
	Cycle                       int                 `json:"cycle"`
	InitialRankHeartbeatTimeout *float64            `json:"initial_rank_heartbeat_timeout"`
	RankHeartbeatTimeout        *float64            `json:"rank_heartbeat_timeout"`
	RankSectionTimeouts         map[string]*float64 `json:"rank_section_timeouts"`
	RankOutOfSectionTimeout     *float64            `json:"rank_out_of_section_timeout"`
	SafetyFactor                float64             `json:"safety_factor"`
	WorkloadCheckInterval       float64             `json:"workload_check_interval"`
	NumWarmupIterations         int                 `json:"num_warmup_iterations"`
	InstallExceptionHook        bool                `json:"install_exception_hook"`
	RankTerminationSignal       int                 `json:"rank_termination_signal"`
	SkipSectionResponse         bool                `json:"skip_section_response"` // always true: native messages have no replies
	// Shm is true when the reply carries a shared-memory heartbeat region.
	Shm bool `json:"shm,omitempty"`
	// ShmSections is true when section events go through the region's
	// ring (docs/protocol.md).
	ShmSections bool `json:"shm_sections,omitempty"`
}

// HeartbeatTimeouts mirrors nvrx's HeartbeatTimeouts (seconds).
type HeartbeatTimeouts struct {
	Initial        *float64 `json:"initial"`
	Subsequent     *float64 `json:"subsequent"`
	WereCalculated bool     `json:"were_calculated"`
}

// SectionTimeouts mirrors nvrx's SectionTimeouts (seconds).
type SectionTimeouts struct {
	Section                  map[string]*float64 `json:"section"`
	OutOfSection             *float64            `json:"out_of_section"`
	CalculatedSections       []string            `json:"calculated_sections"`
	IsOutOfSectionCalculated bool                `json:"is_out_of_section_calculated"`
}

// TimeoutsUpdate is the payload of MsgSetTimeouts and also the shape of
// nvrx's persisted "current_timeouts" object.
type TimeoutsUpdate struct {
	Heartbeat *HeartbeatTimeouts `json:"heartbeat,omitempty"`
	Section   *SectionTimeouts   `json:"section,omitempty"`
}

// WorkloadRequest is the payload of MsgWorkloadRequest. Action is one of
// "Continue", "ExcludeThisNode", "ShutdownWorkload".
type WorkloadRequest struct {
	GlobalRank  int    `json:"global_rank"`
	Action      string `json:"action"`
	Description string `json:"description"`
}

// Ack is the payload of MsgAck.
type Ack struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// AppendFrame appends a length-prefixed message of type t.
func AppendFrame(dst []byte, t byte, payload []byte) []byte {
	dst = append(dst, t)
	dst = binary.AppendUvarint(dst, uint64(len(payload)))
	return append(dst, payload...)
}

// AppendDefineSection appends a MsgDefineSection registering name as id.
func AppendDefineSection(dst []byte, id uint64, name string) []byte {
	var tmp [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(tmp[:], id)
	dst = append(dst, MsgDefineSection)
	dst = binary.AppendUvarint(dst, uint64(n+len(name)))
	dst = append(dst, tmp[:n]...)
	return append(dst, name...)
}

// ParseDefineSection splits a MsgDefineSection payload.
func ParseDefineSection(p []byte) (id uint64, name string, err error) {
	id, n := binary.Uvarint(p)
	if n <= 0 {
		return 0, "", errors.New("define section: bad id")
	}
	return id, string(p[n:]), nil
}

// AppendSectionOp appends MsgSectionOpen or MsgSectionClose for id.
func AppendSectionOp(dst []byte, t byte, id uint64) []byte {
	dst = append(dst, t)
	return binary.AppendUvarint(dst, id)
}

// AppendSectionOpenIter appends MsgSectionOpenIter.
func AppendSectionOpenIter(dst []byte, id uint64, iteration uint64) []byte {
	dst = append(dst, MsgSectionOpenIter)
	dst = binary.AppendUvarint(dst, id)
	return binary.AppendUvarint(dst, iteration)
}

// ByteReader is what ReadPayload reads from: a *bufio.Reader on the server,
// a plain fd reader on the client's handshake.
type ByteReader interface {
	io.Reader
	io.ByteReader
}

// ReadPayload reads the uvarint length and payload that follow a
// length-prefixed type byte.
func ReadPayload(r ByteReader) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, fmt.Errorf("read payload length: %w", err)
	}
	if n > MaxPayload {
		return nil, fmt.Errorf("payload of %d bytes exceeds %d", n, MaxPayload)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return nil, fmt.Errorf("read payload: %w", err)
	}
	return p, nil
}

// ReadMagic reads and checks the 4-byte magic.
func ReadMagic(r io.Reader) error {
	var b [len(Magic)]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("read magic: %w", err)
	}
	if string(b[:3]) != Magic[:3] {
		return fmt.Errorf("bad magic %q", b[:])
	}
	if b[3] != Magic[3] {
		return fmt.Errorf("unsupported protocol version %q (want %q)", b[3], Magic[3])
	}
	return nil
}
