package monitor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/monitor/nvrxwire"
)

// maxNvrxFrame bounds one pickle from a rank; real messages are < 1 KiB.
const maxNvrxFrame = 1 << 20

// readNvrxFrame waits (without deadline) for a frame to start, then reads it
// with the half-message deadline armed.
func readNvrxFrame(dc *deadlineConn, br *bufio.Reader) ([]byte, error) {
	dc.mid = false
	if _, err := br.Peek(1); err != nil {
		return nil, err
	}
	dc.mid = true
	defer func() { dc.mid = false }()
	return nvrxwire.ReadFrame(br, maxNvrxFrame)
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

// nvrxConfig is the FaultToleranceConfig advertised in reply to InitMsg: the
// configured settings with the timeouts in force for this rank.
func (m *Manager) nvrxConfig(r *rankMon, skip bool) *nvrxwire.Config {
	r.mu.Lock()
	to, warm := r.to.Clone(), r.warmupIters
	r.mu.Unlock()
	cfg := m.opts.FT
	cfg.InitialRankHeartbeatTimeout = secsOf(to.InitialHeartbeat)
	cfg.RankHeartbeatTimeout = secsOf(to.Heartbeat)
	cfg.RankOutOfSectionTimeout = secsOf(to.OutOfSection)
	cfg.RankSectionTimeouts = make(map[string]*float64, len(to.Sections))
	for s, d := range to.Sections {
		cfg.RankSectionTimeouts[s] = secsOf(d)
	}
	cfg.NumWarmupIterations = int(warm)
	cfg.SkipSectionResponse = skip
	wire := nvrxwire.Config(cfg) // same fields: the compiler keeps the two in step
	return &wire
}

// serveNvrx runs an nvrx (pickle) session as nvrx's rank monitor server
// does (docs/protocol.md): replies to heartbeats and sections are sent unless the client
// was told skip_section_response=True, which only happens for clients known
// to be >= 0.6 (InitMsg carries iteration keys) when the config allows it.
func (m *Manager) serveNvrx(r *rankMon, gen uint64, dc *deadlineConn, br *bufio.Reader) error {
	reply := func(b []byte) error {
		if err := nvrxwire.WriteFrame(writerWithDeadline{dc.Conn}, b); err != nil {
			return fmt.Errorf("reply: %w", err)
		}
		return nil
	}
	inited, skip := false, false
	log := r.logger()
	for {
		p, err := readNvrxFrame(dc, br)
		if err != nil {
			if isClosed(err) {
				return nil
			}
			return err
		}
		msg, err := nvrxwire.DecodeMessage(p)
		if err != nil {
			return fmt.Errorf("decode nvrx message: %w", err)
		}
		switch x := msg.(type) {
		case *nvrxwire.AuthkeyMsg:
			if err := reply(nvrxwire.EncodeOkMsg(nil)); err != nil {
				return err
			}
		case *nvrxwire.InitMsg:
			if !r.init(gen, initInfo{globalRank: x.RankInfo.GlobalRank, pid: x.RankInfo.PID,
				iteration: x.Iteration, numWarmupIters: x.NumWarmupIters}) {
				return nil
			}
			inited = true
			skip = x.HasIteration && m.opts.FT.SkipSectionResponse
			log.Debug("rank monitor: nvrx client initialised", "global_rank", x.RankInfo.GlobalRank,
				"pid", x.RankInfo.PID, "client_ge_0_6", x.HasIteration, "skip_section_response", skip)
			if err := reply(nvrxwire.EncodeOkMsg(m.nvrxConfig(r, skip))); err != nil {
				return err
			}
		case *nvrxwire.HeartbeatMsg:
			if !inited {
				return errors.New("heartbeat before InitMsg")
			}
			r.heartbeat(gen)
			if !skip {
				if err := reply(nvrxwire.EncodeOkMsg(nil)); err != nil {
					return err
				}
			}
		case *nvrxwire.SectionMsg:
			if !inited {
				return errors.New("section message before InitMsg")
			}
			var cause string
			switch x.Action {
			case nvrxwire.SectionOpen, nvrxwire.SectionClose:
				if x.Section == nil {
					return fmt.Errorf("section action %d without a section name", x.Action)
				}
				if x.Action == nvrxwire.SectionOpen {
					cause = r.openSection(gen, *x.Section, x.Iteration, m.mono())
				} else {
					cause = r.closeSection(gen, *x.Section, m.mono())
				}
			case nvrxwire.SectionCloseAll:
				r.closeAll(gen, m.mono())
			default:
				return fmt.Errorf("unknown section action %d", x.Action)
			}
			if cause != "" && cause != sectionLimitCause {
				log.Warn("rank monitor: " + cause)
			}
			if !skip {
				out := nvrxwire.EncodeOkMsg(nil)
				if cause != "" {
					out = nvrxwire.EncodeErrorMsg(cause)
				}
				if err := reply(out); err != nil {
					return err
				}
			}
		case *nvrxwire.UpdateConfigMsg:
			if u := updateFromNvrx(x); u.Heartbeat != nil || u.Section != nil {
				m.applyClientTimeouts(r, gen, u)
			}
			if err := reply(nvrxwire.EncodeOkMsg(nil)); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected nvrx message %T on a rank socket", msg)
		}
	}
}

// updateFromNvrx converts an UpdateConfigMsg into our update shape.
func updateFromNvrx(x *nvrxwire.UpdateConfigMsg) *ftwire.TimeoutsUpdate {
	u := &ftwire.TimeoutsUpdate{}
	switch {
	case x.HB != nil:
		u.Heartbeat = &ftwire.HeartbeatTimeouts{Initial: x.HB.Initial, Subsequent: x.HB.Subsequent,
			WereCalculated: x.HB.WereCalculated != nil && *x.HB.WereCalculated}
	case x.LegacyInitial != nil || x.LegacySubsequent != nil:
		// v0.1-0.2 clients only sent calculated values this way.
		u.Heartbeat = &ftwire.HeartbeatTimeouts{Initial: x.LegacyInitial, Subsequent: x.LegacySubsequent, WereCalculated: true}
	}
	if s := x.Sections; s != nil {
		u.Section = &ftwire.SectionTimeouts{Section: s.Section, OutOfSection: s.OutOfSection,
			CalculatedSections: slices.Clone(s.CalculatedSections), IsOutOfSectionCalculated: s.IsOutOfSectionCalculated}
	}
	return u
}

// writerWithDeadline bounds each write so a rank that stops reading cannot
// block its session forever.
type writerWithDeadline struct{ c net.Conn }

func (w writerWithDeadline) Write(p []byte) (int, error) {
	if err := writeAll(w.c, p); err != nil {
		return 0, err
	}
	return len(p), nil
}
