package nvrxwire

import (
	"strings"
)

// globalKind says what a whitelisted global may be used for. Nothing here is
// ever "called": each kind maps to a fixed, pure Go constructor.
type globalKind int

const (
	kindClass        globalKind = iota + 1 // NEWOBJ/NEWOBJ_EX target, then BUILD
	kindEnum                               // REDUCE with one int member value
	kindConst                              // the global itself is a value (signal.SIGKILL)
	kindSet                                // builtins.set(iterable)
	kindFrozenSet                          // builtins.frozenset(iterable)
	kindByteArray                          // builtins.bytearray(bytes)
	kindBytes                              // builtins.bytes() (protocol 2 empty bytes)
	kindCodecsEncode                       // _codecs.encode(str, 'latin1') (protocol 2 bytes)
	kindGetattr                            // builtins.getattr(EnumClass, 'MEMBER') (CPython 3.11 enums)
)

// globalRef is a resolved whitelisted global sitting on the unpickler stack.
type globalRef struct {
	module, name string
	kind         globalKind
	members      map[int64]bool // valid values for kindEnum
	value        any            // kindConst
}

func (g *globalRef) String() string { return g.module + "." + g.name }

// Linux signal numbers as exposed by CPython's signal.Signals (1..31, SIGRTMIN, SIGRTMAX).
var linuxSignals = map[string]int64{
	"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGILL": 4, "SIGTRAP": 5, "SIGABRT": 6, "SIGIOT": 6,
	"SIGBUS": 7, "SIGFPE": 8, "SIGKILL": 9, "SIGUSR1": 10, "SIGSEGV": 11, "SIGUSR2": 12,
	"SIGPIPE": 13, "SIGALRM": 14, "SIGTERM": 15, "SIGSTKFLT": 16, "SIGCHLD": 17, "SIGCLD": 17,
	"SIGCONT": 18, "SIGSTOP": 19, "SIGTSTP": 20, "SIGTTIN": 21, "SIGTTOU": 22, "SIGURG": 23,
	"SIGXCPU": 24, "SIGXFSZ": 25, "SIGVTALRM": 26, "SIGPROF": 27, "SIGWINCH": 28, "SIGIO": 29,
	"SIGPOLL": 29, "SIGPWR": 30, "SIGSYS": 31, "SIGRTMIN": 34, "SIGRTMAX": 64,
}

// signalNames maps a number back to CPython's canonical member name.
var signalNames = func() map[int64]string {
	m := make(map[int64]string, len(linuxSignals))
	for name, n := range linuxSignals {
		switch name {
		case "SIGIOT", "SIGCLD", "SIGPOLL": // aliases
			continue
		}
		m[n] = name
	}
	return m
}()

// Data-module classes that are plain classes or dataclasses (NEWOBJ + BUILD).
var dataClasses = []string{
	"AuthkeyMsg", "InitMsg", "RankInfo", "HeartbeatMsg", "SectionMsg", "UpdateConfigMsg",
	"HeartbeatTimeouts", "SectionTimeouts", "OkMsg", "ErrorMsg", "WorkloadControlRequest",
}

// Enum classes of the data module: member name -> value.
var dataEnums = map[string]map[string]int64{
	"SectionAction":  {"OPEN": 1, "CLOSE": 2, "CLOSE_ALL": 3},
	"WorkloadAction": {"Continue": 0, "ExcludeThisNode": 1, "ShutdownWorkload": 2},
}

// lookupGlobal resolves (module, name) against the whitelist. It returns
// nil for anything not explicitly allowed.
func lookupGlobal(module, name string) *globalRef {
	switch module {
	case DataModule:
		for _, c := range dataClasses {
			if name == c {
				return &globalRef{module: module, name: name, kind: kindClass}
			}
		}
		if members, ok := dataEnums[name]; ok {
			vals := make(map[int64]bool, len(members))
			for _, v := range members {
				vals[v] = true
			}
			return &globalRef{module: module, name: name, kind: kindEnum, members: vals}
		}
		// Protocol 4 may name an enum member by qualified name: SectionAction.OPEN.
		if cls, member, ok := strings.Cut(name, "."); ok {
			if v, ok := dataEnums[cls][member]; ok {
				return &globalRef{module: module, name: name, kind: kindConst, value: enumValue(module, cls, v)}
			}
		}
	case ConfigModule:
		if name == ConfigClass {
			return &globalRef{module: module, name: name, kind: kindClass}
		}
	case "signal":
		if name == "Signals" {
			vals := make(map[int64]bool, len(signalNames))
			for n := range signalNames {
				vals[n] = true
			}
			return &globalRef{module: module, name: name, kind: kindEnum, members: vals}
		}
		// CPython pickles signal.Signals members by their module-level name.
		if n, ok := linuxSignals[name]; ok {
			return &globalRef{module: module, name: name, kind: kindConst, value: enumValue("signal", "Signals", n)}
		}
	case "builtins", "__builtin__": // __builtin__ is protocol 2's fix_imports spelling
		switch name {
		case "set":
			return &globalRef{module: module, name: name, kind: kindSet}
		case "frozenset":
			return &globalRef{module: module, name: name, kind: kindFrozenSet}
		case "bytearray":
			return &globalRef{module: module, name: name, kind: kindByteArray}
		case "bytes":
			return &globalRef{module: module, name: name, kind: kindBytes}
		case "getattr":
			return &globalRef{module: module, name: name, kind: kindGetattr}
		}
	case "_codecs":
		if name == "encode" {
			return &globalRef{module: module, name: name, kind: kindCodecsEncode}
		}
	}
	return nil
}

// enumMember resolves a member name of a whitelisted enum class.
func enumMember(g *globalRef, member string) (*Object, bool) {
	switch {
	case g.module == DataModule:
		if v, ok := dataEnums[g.name][member]; ok {
			return enumValue(g.module, g.name, v), true
		}
	case g.module == "signal" && g.name == "Signals":
		if v, ok := linuxSignals[member]; ok {
			return enumValue(g.module, g.name, v), true
		}
	}
	return nil, false
}

// enumValue builds the decoded form of an enum member: an immutable Object
// whose Args hold the member value, as if Class(value) had been reduced.
func enumValue(module, class string, v int64) *Object {
	o := &Object{Module: module, Name: class, Args: Tuple{v}}
	o.sealed = true
	o.size = 2
	o.depth = 1
	return o
}

// reduce implements REDUCE for the few whitelisted callables, each as a
// fixed Go function of plain data. Classes are never reducible.
func (d *decoder) reduce(g *globalRef, args []any) (any, error) {
	switch g.kind {
	case kindEnum:
		if len(args) != 1 {
			return nil, d.errf("%s() takes 1 argument, got %d", g, len(args))
		}
		v, ok := args[0].(int64)
		if !ok || !g.members[v] {
			return nil, d.errf("invalid %s value %s", g, describe(args[0]))
		}
		return enumValue(g.module, g.name, v), nil
	case kindSet, kindFrozenSet:
		s := &Set{Frozenset: g.kind == kindFrozenSet, meta: meta{size: 1}}
		if len(args) == 0 {
			return s, nil
		}
		if len(args) != 1 {
			return nil, d.errf("%s() takes at most 1 argument, got %d", g, len(args))
		}
		var items []any
		switch src := args[0].(type) {
		case *listV:
			items = src.items
		case *tupleV:
			items = src.items
		case *Set:
			items = src.Items
		default:
			return nil, d.errf("%s() of %s", g, typeName(args[0]))
		}
		if err := d.addItems(s, items); err != nil {
			return nil, err
		}
		return s, nil
	case kindByteArray:
		switch {
		case len(args) == 0:
			return ByteArray{}, nil
		case len(args) == 1:
			if b, ok := args[0].([]byte); ok {
				return ByteArray(append([]byte{}, b...)), nil
			}
		}
		return nil, d.errf("unsupported arguments to %s", g)
	case kindBytes:
		if len(args) == 0 {
			return []byte{}, nil
		}
		return nil, d.errf("unsupported arguments to %s", g)
	case kindGetattr:
		if len(args) == 2 {
			cls, ok1 := args[0].(*globalRef)
			member, ok2 := args[1].(string)
			if ok1 && ok2 && cls.kind == kindEnum {
				if v, ok := enumMember(cls, member); ok {
					return v, nil
				}
				return nil, d.errf("%s has no member %s", cls, describe(member))
			}
		}
		return nil, d.errf("getattr is only allowed on whitelisted enum classes")
	case kindCodecsEncode:
		if len(args) == 2 {
			s, ok1 := args[0].(string)
			enc, ok2 := args[1].(string)
			if ok1 && ok2 && (enc == "latin1" || enc == "latin-1") {
				out := make([]byte, 0, len(s))
				for _, r := range s {
					if r > 0xFF {
						return nil, d.errf("%s: character U+%04X not in latin1", g, r)
					}
					out = append(out, byte(r))
				}
				return out, nil
			}
		}
		return nil, d.errf("unsupported arguments to %s", g)
	}
	return nil, d.errf("REDUCE of non-whitelisted callable %s", g)
}
