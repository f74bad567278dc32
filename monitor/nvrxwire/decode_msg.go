package nvrxwire

import (
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
)

// DecodeMessage decodes one framed payload received from a rank or the
// launcher into *AuthkeyMsg, *InitMsg, *HeartbeatMsg, *SectionMsg,
// *UpdateConfigMsg, *WorkloadControlRequest or *ControlString. Anything else,
// including well-formed pickles of other whitelisted classes such as OkMsg,
// is an error. Unknown attributes are ignored so newer clients keep working.
func DecodeMessage(payload []byte) (any, error) {
	v, err := Decode(payload)
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case string:
		switch c := ControlString(x); c {
		case ControlCloseWorkerIPC, ControlShutdown:
			return &c, nil
		}
		return nil, fmt.Errorf("nvrxwire: unknown control string %s", describe(x))
	case Tuple:
		return decodeWorkloadControl(x)
	case *Object:
		if x.Module != DataModule {
			return nil, fmt.Errorf("nvrxwire: unexpected message %s.%s", x.Module, x.Name)
		}
		a := attrs{d: x.Attrs()}
		var msg any
		switch x.Name {
		case "AuthkeyMsg":
			msg, err = decodeAuthkey(a)
		case "InitMsg":
			msg, err = decodeInit(a)
		case "HeartbeatMsg":
			msg, err = decodeHeartbeat(a)
		case "SectionMsg":
			msg, err = decodeSection(a)
		case "UpdateConfigMsg":
			msg, err = decodeUpdateConfig(a)
		default:
			return nil, fmt.Errorf("nvrxwire: unexpected message %s.%s", x.Module, x.Name)
		}
		if err != nil {
			return nil, fmt.Errorf("nvrxwire: %s: %w", x.Name, err)
		}
		return msg, nil
	}
	return nil, fmt.Errorf("nvrxwire: unexpected message of type %s", typeName(v))
}

var errMissing = errors.New("missing")

// attrs reads typed attributes of a decoded instance.
type attrs struct{ d *Dict }

func (a attrs) has(name string) bool {
	_, ok := a.d.Get(name)
	return ok
}

func (a attrs) raw(name string) (any, error) {
	v, ok := a.d.Get(name)
	if !ok {
		return nil, fmt.Errorf("attribute %s: %w", name, errMissing)
	}
	return v, nil
}

func (a attrs) int(name string) (int64, error) {
	v, err := a.raw(name)
	if err != nil {
		return 0, err
	}
	n, err := asInt(v)
	if err != nil {
		return 0, fmt.Errorf("attribute %s: %w", name, err)
	}
	return n, nil
}

// optInt reads an int|None attribute; a missing attribute is None.
func (a attrs) optInt(name string) (*int64, error) {
	v, ok := a.d.Get(name)
	if !ok || v == nil {
		return nil, nil
	}
	n, err := asInt(v)
	if err != nil {
		return nil, fmt.Errorf("attribute %s: %w", name, err)
	}
	return &n, nil
}

// optFloat reads a float|None attribute (ints are accepted as Python does).
func (a attrs) optFloat(name string) (*float64, error) {
	v, ok := a.d.Get(name)
	if !ok {
		return nil, nil
	}
	f, err := asOptFloat(v)
	if err != nil {
		return nil, fmt.Errorf("attribute %s: %w", name, err)
	}
	return f, nil
}

func (a attrs) optString(name string) (*string, bool, error) {
	v, ok := a.d.Get(name)
	if !ok || v == nil {
		return nil, ok, nil
	}
	s, isStr := v.(string)
	if !isStr {
		return nil, true, fmt.Errorf("attribute %s: want str or None, got %s", name, typeName(v))
	}
	return &s, true, nil
}

func (a attrs) object(name, class string) (*Object, error) {
	v, ok := a.d.Get(name)
	if !ok || v == nil {
		return nil, nil
	}
	o, isObj := v.(*Object)
	if !isObj || o.Module != DataModule || o.Name != class {
		return nil, fmt.Errorf("attribute %s: want %s or None, got %s", name, class, typeName(v))
	}
	return o, nil
}

func asInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case bool: // bool is an int subclass in Python
		if x {
			return 1, nil
		}
		return 0, nil
	case *big.Int:
		return 0, fmt.Errorf("int %s out of range", x)
	}
	return 0, fmt.Errorf("want int, got %s", typeName(v))
}

func asOptFloat(v any) (*float64, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case float64:
		return &x, nil
	case int64:
		f := float64(x)
		return &f, nil
	case bool:
		f := 0.0
		if x {
			f = 1
		}
		return &f, nil
	}
	return nil, fmt.Errorf("want float or None, got %s", typeName(v))
}

func toInt(n int64) (int, error) {
	if int64(int(n)) != n {
		return 0, fmt.Errorf("int %d out of range", n)
	}
	return int(n), nil
}

func decodeAuthkey(a attrs) (*AuthkeyMsg, error) {
	v, err := a.raw("authkey")
	if err != nil {
		return nil, err
	}
	switch k := v.(type) {
	case []byte:
		return &AuthkeyMsg{Authkey: k}, nil
	case ByteArray:
		return &AuthkeyMsg{Authkey: []byte(k)}, nil
	case nil:
		return &AuthkeyMsg{}, nil
	}
	return nil, fmt.Errorf("attribute authkey: want bytes, got %s", typeName(v))
}

func decodeInit(a attrs) (*InitMsg, error) {
	m := &InitMsg{}
	ri, err := a.object("rank_info", "RankInfo")
	if err != nil {
		return nil, err
	}
	if ri == nil {
		return nil, fmt.Errorf("attribute rank_info: %w", errMissing)
	}
	if m.RankInfo, err = decodeRankInfo(attrs{d: ri.Attrs()}); err != nil {
		return nil, fmt.Errorf("rank_info: %w", err)
	}
	m.HasIteration = a.has("iteration") || a.has("num_warmup_iters")
	if m.Iteration, err = a.optInt("iteration"); err != nil {
		return nil, err
	}
	if m.NumWarmupIters, err = a.optInt("num_warmup_iters"); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeRankInfo accepts v0.3+ (global_rank, local_rank, host, pid) and
// v0.1-0.2 (rank, host, pid). global_rank is the RANK env string when
// torch.distributed was not initialized, so decimal strings are accepted.
func decodeRankInfo(a attrs) (RankInfo, error) {
	var ri RankInfo
	name := "global_rank"
	if !a.has(name) && a.has("rank") {
		name = "rank"
	}
	v, err := a.raw(name)
	if err != nil {
		return ri, err
	}
	var g int64
	if s, ok := v.(string); ok {
		if g, err = strconv.ParseInt(s, 10, 64); err != nil {
			return ri, fmt.Errorf("attribute %s: %s is not an integer", name, describe(s))
		}
	} else if g, err = asInt(v); err != nil {
		return ri, fmt.Errorf("attribute %s: %w", name, err)
	}
	if ri.GlobalRank, err = toInt(g); err != nil {
		return ri, err
	}
	ri.LocalRank = -1
	if a.has("local_rank") {
		l, err := a.int("local_rank")
		if err != nil {
			return ri, err
		}
		if ri.LocalRank, err = toInt(l); err != nil {
			return ri, err
		}
	}
	host, _, err := a.optString("host")
	if err != nil {
		return ri, err
	}
	if host != nil {
		ri.Host = *host
	}
	pid, err := a.int("pid")
	if err != nil {
		return ri, err
	}
	if ri.PID, err = toInt(pid); err != nil {
		return ri, err
	}
	return ri, nil
}

func decodeHeartbeat(a attrs) (*HeartbeatMsg, error) {
	r, err := a.int("rank")
	if err != nil {
		return nil, err
	}
	m := &HeartbeatMsg{}
	if m.Rank, err = toInt(r); err != nil {
		return nil, err
	}
	for _, name := range []string{"state", "state_dict_for_chkpt"} {
		v, ok := a.d.Get(name)
		if !ok || v == nil {
			continue
		}
		st, isDict := v.(*Dict)
		if !isDict {
			return nil, fmt.Errorf("attribute %s: want dict or None, got %s", name, typeName(v))
		}
		m.StateLen += st.Len()
	}
	return m, nil
}

func decodeSection(a attrs) (*SectionMsg, error) {
	r, err := a.int("rank")
	if err != nil {
		return nil, err
	}
	m := &SectionMsg{}
	if m.Rank, err = toInt(r); err != nil {
		return nil, err
	}
	if m.Section, _, err = a.optString("section"); err != nil {
		return nil, err
	}
	v, err := a.raw("action")
	if err != nil {
		return nil, err
	}
	act, ok := v.(*Object)
	if !ok || act.Module != DataModule || act.Name != "SectionAction" {
		return nil, fmt.Errorf("attribute action: want SectionAction, got %s", typeName(v))
	}
	n, _ := act.EnumValue() // validated when the member was built
	m.Action = SectionAction(n)
	if m.Iteration, err = a.optInt("iteration"); err != nil {
		return nil, err
	}
	return m, nil
}

func decodeUpdateConfig(a attrs) (*UpdateConfigMsg, error) {
	m := &UpdateConfigMsg{}
	hb, err := a.object("hb_timeouts", "HeartbeatTimeouts")
	if err != nil {
		return nil, err
	}
	if hb != nil {
		ha := attrs{d: hb.Attrs()}
		m.HB = &HeartbeatTimeouts{}
		if m.HB.Initial, err = ha.optFloat("initial"); err != nil {
			return nil, fmt.Errorf("hb_timeouts: %w", err)
		}
		if m.HB.Subsequent, err = ha.optFloat("subsequent"); err != nil {
			return nil, fmt.Errorf("hb_timeouts: %w", err)
		}
		if v, ok := ha.d.Get("were_calculated"); ok && v != nil {
			b, isBool := v.(bool)
			if !isBool {
				return nil, fmt.Errorf("hb_timeouts: attribute were_calculated: want bool or None, got %s", typeName(v))
			}
			m.HB.WereCalculated = &b
		}
	}
	st, err := a.object("section_timeouts", "SectionTimeouts")
	if err != nil {
		return nil, err
	}
	if st != nil {
		if m.Sections, err = decodeSectionTimeouts(attrs{d: st.Attrs()}); err != nil {
			return nil, fmt.Errorf("section_timeouts: %w", err)
		}
	}
	if m.CurrentCycle, err = a.optInt("current_cycle"); err != nil {
		return nil, err
	}
	if m.LegacyInitial, err = a.optFloat("new_initial_heartbeat_timeout"); err != nil {
		return nil, err
	}
	if m.LegacySubsequent, err = a.optFloat("new_heartbeat_timeout"); err != nil {
		return nil, err
	}
	return m, nil
}

func decodeSectionTimeouts(a attrs) (*SectionTimeouts, error) {
	s := &SectionTimeouts{Section: map[string]*float64{}}
	if v, ok := a.d.Get("section"); ok && v != nil {
		d, isDict := v.(*Dict)
		if !isDict {
			return nil, fmt.Errorf("attribute section: want dict, got %s", typeName(v))
		}
		for i, k := range d.Keys {
			name, isStr := k.(string)
			if !isStr {
				return nil, fmt.Errorf("attribute section: key is %s, not str", typeName(k))
			}
			f, err := asOptFloat(d.Values[i])
			if err != nil {
				return nil, fmt.Errorf("attribute section[%s]: %w", describe(name), err)
			}
			s.Section[name] = f
		}
	}
	var err error
	if s.OutOfSection, err = a.optFloat("out_of_section"); err != nil {
		return nil, err
	}
	if v, ok := a.d.Get("calculated_sections"); ok && v != nil {
		s.CalculatedSections = []string{}
		var items []any
		switch c := v.(type) {
		case *Set:
			items = c.Items
		case []any:
			items = c
		case Tuple:
			items = c
		default:
			return nil, fmt.Errorf("attribute calculated_sections: want set, got %s", typeName(v))
		}
		for _, it := range items {
			name, isStr := it.(string)
			if !isStr {
				return nil, fmt.Errorf("attribute calculated_sections: item is %s, not str", typeName(it))
			}
			s.CalculatedSections = append(s.CalculatedSections, name)
		}
		slices.Sort(s.CalculatedSections)
		s.CalculatedSections = slices.Compact(s.CalculatedSections)
	}
	if v, ok := a.d.Get("is_out_of_section_calculated"); ok && v != nil {
		b, isBool := v.(bool)
		if !isBool {
			return nil, fmt.Errorf("attribute is_out_of_section_calculated: want bool, got %s", typeName(v))
		}
		s.IsOutOfSectionCalculated = b
	}
	return s, nil
}

// decodeWorkloadControl decodes (global_rank, WorkloadControlRequest).
func decodeWorkloadControl(t Tuple) (*WorkloadControlRequest, error) {
	if len(t) != 2 {
		return nil, fmt.Errorf("nvrxwire: workload control tuple has %d items, want 2", len(t))
	}
	g, err := asInt(t[0])
	if err != nil {
		return nil, fmt.Errorf("nvrxwire: workload control global rank: %w", err)
	}
	o, ok := t[1].(*Object)
	if !ok || o.Module != DataModule || o.Name != "WorkloadControlRequest" {
		return nil, fmt.Errorf("nvrxwire: workload control: want WorkloadControlRequest, got %s", typeName(t[1]))
	}
	r := &WorkloadControlRequest{}
	if r.GlobalRank, err = toInt(g); err != nil {
		return nil, fmt.Errorf("nvrxwire: workload control global rank: %w", err)
	}
	a := attrs{d: o.Attrs()}
	v, err := a.raw("action")
	if err != nil {
		return nil, fmt.Errorf("nvrxwire: WorkloadControlRequest: %w", err)
	}
	act, ok := v.(*Object)
	if !ok || act.Module != DataModule || act.Name != "WorkloadAction" {
		return nil, fmt.Errorf("nvrxwire: WorkloadControlRequest: attribute action: want WorkloadAction, got %s", typeName(v))
	}
	n, _ := act.EnumValue()
	r.Action = WorkloadAction(n)
	desc, _, err := a.optString("description")
	if err != nil {
		return nil, fmt.Errorf("nvrxwire: WorkloadControlRequest: %w", err)
	}
	if desc != nil {
		r.Description = *desc
	}
	return r, nil
}
