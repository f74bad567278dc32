package monitor

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/monitor/nvrxwire"
)

// WorkloadAction is what a rank asks of the launcher. Its values are the
// member names of nvrx's data.WorkloadAction (nvrxwire.WorkloadAction's
// String()), as the native protocol (ftwire) and the event log carry them.
type WorkloadAction = eventlog.WorkloadAction

// Workload actions.
const (
	ActionContinue         = eventlog.WorkloadContinue
	ActionExcludeThisNode  = eventlog.WorkloadExcludeThisNode
	ActionShutdownWorkload = eventlog.WorkloadShutdownWorkload
)

// ParseWorkloadAction returns the action named s, or false when s names
// none.
func ParseWorkloadAction(s string) (WorkloadAction, bool) {
	switch a := WorkloadAction(s); a {
	case ActionContinue, ActionExcludeThisNode, ActionShutdownWorkload:
		return a, true
	}
	return "", false
}

// actionOf is the action of an nvrx request ("" for an unknown value).
func actionOf(a nvrxwire.WorkloadAction) WorkloadAction {
	act, _ := ParseWorkloadAction(a.String())
	return act
}

// serveControl handles one workload-control connection: one request, one
// acknowledgement, close (as nvrx's launcher IPC does). Any process of our
// uid may send.
func (m *Manager) serveControl(c *net.UnixConn) {
	cred, err := peerCred(c)
	if err != nil || int(cred.Uid) != m.opts.UID {
		args := []any{"err", err}
		if cred != nil {
			args = append(args, "peer_pid", cred.Pid, "peer_uid", cred.Uid)
		}
		m.log.Warn("launcher socket: refusing peer", args...)
		return
	}
	dc := &deadlineConn{Conn: c, mid: true} // the request follows the connect at once
	br := newReader(dc)
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	var req WorkloadRequest
	var ack []byte
	switch first[0] {
	case 0x00:
		p, err := nvrxwire.ReadFrame(br, maxNvrxFrame)
		if err != nil {
			m.log.Error("launcher socket: read request", "peer_pid", cred.Pid, "err", err)
			return
		}
		msg, err := nvrxwire.DecodeMessage(p)
		if err != nil {
			m.log.Error("launcher socket: decode request", "peer_pid", cred.Pid, "err", err)
			return
		}
		x, ok := msg.(*nvrxwire.WorkloadControlRequest)
		if !ok || actionOf(x.Action) == "" {
			m.log.Error("launcher socket: unexpected message", "peer_pid", cred.Pid, "type", fmt.Sprintf("%T", msg))
			return
		}
		req = WorkloadRequest{GlobalRank: x.GlobalRank, Action: actionOf(x.Action), Description: x.Description}
		ack, _ = nvrxwire.AppendFrame(nil, nvrxwire.EncodeBytesOK()) // a few bytes: always fits
	case ftwire.Magic[0]:
		if err := ftwire.ReadMagic(br); err != nil {
			m.log.Error("launcher socket: native request", "err", err)
			return
		}
		t, err := br.ReadByte()
		if err != nil || t != ftwire.MsgWorkloadRequest {
			m.log.Error("launcher socket: expected a workload request", "type", t, "err", err)
			return
		}
		p, err := ftwire.ReadPayload(br)
		if err != nil {
			m.log.Error("launcher socket: read request", "err", err)
			return
		}
		var w ftwire.WorkloadRequest
		err = json.Unmarshal(p, &w)
		action, valid := ParseWorkloadAction(w.Action)
		if err != nil || !valid {
			b, _ := json.Marshal(ftwire.Ack{Error: fmt.Sprintf("invalid request (action %q, err %v)", w.Action, err)})
			_ = writeAll(c, ftwire.AppendFrame([]byte(ftwire.Magic), ftwire.MsgAck, b))
			return
		}
		req = WorkloadRequest{GlobalRank: w.GlobalRank, Action: action, Description: w.Description}
		b, _ := json.Marshal(ftwire.Ack{OK: true})
		ack = ftwire.AppendFrame([]byte(ftwire.Magic), ftwire.MsgAck, b)
	default:
		m.log.Error("launcher socket: unknown protocol", "first_byte", first[0], "peer_pid", cred.Pid)
		return
	}
	m.log.Info("workload control request", "global_rank", req.GlobalRank, "action", req.Action,
		"description", req.Description, "peer_pid", cred.Pid)
	select {
	case m.reqs <- req:
	default:
		m.log.Error("workload request channel full; dropping request", "action", req.Action)
	}
	if err := writeAll(c, ack); err != nil {
		m.log.Warn("launcher socket: write ack", "err", err)
	}
}
