package configs

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// Gossip is the node-loss detector's settings from --rdzv-conf
// (docs/rendezvous.md, "Detection"). A zero field takes the rendezvous
// default (rendezvous.DefaultGossipTimings).
type Gossip struct {
	ProbeInterval time.Duration // gossip_probe_interval
	ProbeTimeout  time.Duration // gossip_probe_timeout
	SuspicionMult int           // gossip_suspicion_mult
	// IndirectChecks is gossip_indirect_checks; -1 stands for a given 0
	// (no indirect probes), since 0 means the default.
	IndirectChecks int
}

// defaultGossipProbeInterval is rendezvous.DefaultGossipTimings'
// ProbeInterval: a given probe timeout must be shorter than the interval in
// effect.
const defaultGossipProbeInterval = 200 * time.Millisecond

// gossipKeys are the --rdzv-conf keys of the detector.
var gossipKeys = []string{"gossip_probe_interval", "gossip_probe_timeout", "gossip_suspicion_mult", "gossip_indirect_checks"}

// rdzvConfGossip reads and checks the detector's keys.
func (p *parser) rdzvConfGossip(r *Rendezvous, confSubj string) error {
	conf := p.cfg.RdzvConf
	secs := func(key string, lo, hi time.Duration, dst *time.Duration) error {
		v, ok := conf[key]
		if !ok {
			return nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || f < lo.Seconds() || f > hi.Seconds() {
			return usageErr(confSubj, "%s %s=%q: must be a number of seconds from %g to %g", confSubj, key, v, lo.Seconds(), hi.Seconds())
		}
		*dst = time.Duration(math.Round(f * float64(time.Second)))
		return nil
	}
	count := func(key string, lo, hi int, dst *int) error { return p.wholeConf(confSubj, key, lo, hi, dst) }
	g := &r.Gossip
	if err := secs("gossip_probe_interval", 10*time.Millisecond, 60*time.Second, &g.ProbeInterval); err != nil {
		return err
	}
	if err := secs("gossip_probe_timeout", time.Millisecond, 30*time.Second, &g.ProbeTimeout); err != nil {
		return err
	}
	if err := count("gossip_suspicion_mult", 1, 100, &g.SuspicionMult); err != nil {
		return err
	}
	if err := count("gossip_indirect_checks", 0, 32, &g.IndirectChecks); err != nil {
		return err
	}
	if _, ok := conf["gossip_indirect_checks"]; ok && g.IndirectChecks == 0 {
		g.IndirectChecks = -1
	}
	interval := g.ProbeInterval
	if interval == 0 {
		interval = defaultGossipProbeInterval
	}
	if g.ProbeTimeout != 0 && g.ProbeTimeout >= interval {
		return usageErr(confSubj, "%s gossip_probe_timeout=%s: must be shorter than the probe interval (%s): a probe and its indirect probes fit in one interval",
			confSubj, conf["gossip_probe_timeout"], interval)
	}
	return nil
}

// wholeConf reads --rdzv-conf key as a whole number from lo to hi into
// dst; an absent key leaves dst alone.
func (p *parser) wholeConf(confSubj, key string, lo, hi int, dst *int) error {
	v, ok := p.cfg.RdzvConf[key]
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < lo || n > hi {
		return usageErr(confSubj, "%s %s=%q: must be a whole number from %d to %d", confSubj, key, v, lo, hi)
	}
	*dst = n
	return nil
}
