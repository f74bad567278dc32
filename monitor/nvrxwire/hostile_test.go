package nvrxwire

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// pk concatenates opcodes and arguments into a pickle.
func pk(parts ...any) []byte {
	var b []byte
	for _, p := range parts {
		switch x := p.(type) {
		case byte:
			b = append(b, x)
		case int:
			b = append(b, byte(x))
		case rune:
			b = append(b, byte(x))
		case string:
			b = append(b, x...)
		case []byte:
			b = append(b, x...)
		default:
			panic("pk: bad part")
		}
	}
	return b
}

func sbu(s string) []byte { return append([]byte{opShortBinUni, byte(len(s))}, s...) }

func u32le(n uint32) []byte { return binary.LittleEndian.AppendUint32(nil, n) }

func u64le(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }

func repeat(n int, parts ...any) []byte { return bytes.Repeat(pk(parts...), n) }

// sharedBlowup doubles a list's expanded size per level through the memo:
// l(i+1) = [l(i), l(i)] (a "billion laughs" in pickle form).
func sharedBlowup(levels int) []byte {
	b := pk(opProto, 4, opEmptyList, opBinInt1, 0, opAppend, opMemoize)
	for i := 0; i < levels; i++ {
		b = append(b, pk(opEmptyList, opMark, opLongBinGet, u32le(uint32(i)), opLongBinGet, u32le(uint32(i)), opAppends, opMemoize, opPop)...)
	}
	return append(b, pk(opLongBinGet, u32le(uint32(levels)), opStop)...)
}

func TestDecodeRejectsHostileInput(t *testing.T) {
	data := DataModule
	tests := []struct {
		name    string
		payload []byte
		wantErr string
	}{
		{"empty", nil, "truncated at offset 0"},
		{"proto only", pk(opProto, 4), "truncated at offset 2"},
		{"no stop", pk(opProto, 4, opNone), "truncated at offset 3"},
		{"future protocol", pk(opProto, 6, opNone, opStop), "unsupported pickle protocol 6"},
		{"os.system via GLOBAL", pk(opProto, 2, opGlobal, "os\nsystem\n", sbu("id"), opTuple1, opReduce, opStop), "unknown global os.system"},
		{"builtins.eval via STACK_GLOBAL", pk(opProto, 4, sbu("builtins"), sbu("eval"), opStackGlobal, sbu("1"), opTuple1, opReduce, opStop), "unknown global builtins.eval"},
		{"subprocess.Popen", pk(opProto, 4, sbu("subprocess"), sbu("Popen"), opStackGlobal, opStop), "unknown global subprocess.Popen"},
		{"protocol 2 __builtin__.eval", pk(opProto, 2, opGlobal, "__builtin__\neval\n", opStop), "unknown global __builtin__.eval"},
		{"data module dunder", pk(opProto, 4, sbu(data), sbu("__builtins__"), opStackGlobal, opStop), "unknown global " + data + ".__builtins__"},
		{"copyreg reconstructor", pk(opProto, 2, opGlobal, "copy_reg\n_reconstructor\n", opStop), "unknown global copy_reg._reconstructor"},
		{"REDUCE of a class", pk(opProto, 4, sbu(data), sbu("OkMsg"), opStackGlobal, opEmptyTuple, opReduce, opStop), "REDUCE of non-whitelisted callable " + data + ".OkMsg"},
		{"getattr on a class", pk(opProto, 4, sbu("builtins"), sbu("getattr"), opStackGlobal, sbu(data), sbu("OkMsg"), opStackGlobal, sbu("__init__"), opTuple2, opReduce, opStop), "getattr is only allowed on whitelisted enum classes"},
		{"getattr dunder of enum", pk(opProto, 4, sbu("builtins"), sbu("getattr"), opStackGlobal, sbu(data), sbu("SectionAction"), opStackGlobal, sbu("__class__"), opTuple2, opReduce, opStop), "has no member"},
		{"enum bad value", pk(opProto, 4, sbu(data), sbu("SectionAction"), opStackGlobal, opBinInt1, 7, opTuple1, opReduce, opStop), "invalid " + data + ".SectionAction value 7"},
		{"enum value of wrong type", pk(opProto, 4, sbu("signal"), sbu("Signals"), opStackGlobal, sbu("9"), opTuple1, opReduce, opStop), `invalid signal.Signals value "9"`},
		{"NEWOBJ of enum", pk(opProto, 4, sbu(data), sbu("SectionAction"), opStackGlobal, opEmptyTuple, opNewObj, opStop), "NEWOBJ of non-class global"},
		{"NEWOBJ of string", pk(opProto, 4, sbu("x"), opEmptyTuple, opNewObj, opStop), "NEWOBJ of str"},
		{"global as result", pk(opProto, 4, sbu(data), sbu("OkMsg"), opStackGlobal, opStop), "global " + data + ".OkMsg used as a value"},
		{"global inside list", pk(opProto, 4, opEmptyList, sbu(data), sbu("OkMsg"), opStackGlobal, opAppend, opStop), "used as a value"},
		{"tuple with global as result", pk(opProto, 4, sbu(data), sbu("SectionAction"), opStackGlobal, opTuple1, opStop), "tuple holding a global"},
		{"10^5 MARKs", pk(opProto, 4, repeat(100000, opMark), opStop), "more than 64 nested MARKs"},
		{"10^5 EMPTY_LIST", pk(opProto, 4, repeat(100000, opEmptyList), opStop), "stack exceeds"},
		{"deep list nesting", pk(opProto, 4, repeat(1000, opEmptyList), repeat(999, opAppend), opStop), "nesting deeper than 64"},
		{"deep tuple nesting", pk(opProto, 4, opEmptyTuple, repeat(100000, opTuple1), opStop), "nesting deeper than 64"},
		{"deep dict nesting", pk(opProto, 4, repeat(200, opEmptyDict, sbu("k")), repeat(200, opNone), opStop), "STOP with"},
		{"deep MARK list nesting", pk(opProto, 4, repeat(60, opMark), repeat(60, opList), opStop), ""},
		{"shared reference blowup", sharedBlowup(40), "expands to more than"},
		{"huge BINUNICODE8", pk(opProto, 4, opBinUnicode8, u64le(1<<62), "abc", opStop), "truncated at offset"},
		{"max BINUNICODE8", pk(opProto, 4, opBinUnicode8, u64le(^uint64(0)), opStop), "truncated at offset"},
		{"huge BINBYTES", pk(opProto, 4, opBinBytes, u32le(0xFFFFFFFF), "ab", opStop), "truncated at offset"},
		{"huge BYTEARRAY8", pk(opProto, 5, opByteArray8, u64le(1<<40), opStop), "truncated at offset"},
		{"huge LONG4", pk(opProto, 4, opLong4, u32le(1<<31), opStop), "exceeds"},
		{"huge FRAME", pk(opProto, 4, opFrame, u64le(1<<60), opNone, opStop), "truncated at offset"},
		{"memo get missing", pk(opProto, 4, opBinGet, 3, opStop), "memo key 3 missing"},
		{"memo put on empty stack", pk(opProto, 4, opMemoize, opNone, opStop), "stack underflow"},
		{"memo flood", pk(opProto, 4, opNone, repeat(MaxMemo+1, opMemoize), opStop), "memo exceeds"},
		{"memo flood LONG_BINPUT", pk(opProto, 4, opNone, func() []byte {
			var b []byte
			for i := 0; i <= MaxMemo; i++ {
				b = append(b, opLongBinPut)
				b = append(b, u32le(uint32(i*7919))...)
			}
			return b
		}(), opStop), "memo exceeds"},
		{"text PUT garbage index", pk(opProto, 2, opNone, opPut, "12x\n", opStop), "bad memo index"},
		{"unterminated GLOBAL", pk(opProto, 2, opGlobal, "os"), "truncated"},
		{"overlong GLOBAL line", pk(opProto, 2, opGlobal, strings.Repeat("a", 2000), "\nx\n", opStop), "longer than"},
		{"recursive list", pk(opProto, 4, opEmptyList, opMemoize, opBinGet, 0, opAppend, opStop), "recursive structure"},
		{"mutation after reference", pk(opProto, 4, opEmptyList, opMemoize, opEmptyList, opBinGet, 0, opAppend, opPop, opBinInt1, 1, opAppend, opStop), "modified after being referenced"},
		{"recursive object state", pk(opProto, 4, sbu(data), sbu("OkMsg"), opStackGlobal, opEmptyTuple, opNewObj, opMemoize, opEmptyDict, sbu("self"), opBinGet, 0, opSetItem, opBuild, opStop), "modified after being referenced"},
		{"unhashable key", pk(opProto, 4, opEmptyDict, opEmptyList, opNone, opSetItem, opStop), "unhashable key type list"},
		{"odd SETITEMS", pk(opProto, 4, opEmptyDict, opMark, opNone, opSetItems, opStop), "odd number of items"},
		{"SETITEM on list", pk(opProto, 4, opEmptyList, opNone, opNone, opSetItem, opStop), "SETITEM on list"},
		{"APPEND on dict", pk(opProto, 4, opEmptyDict, opNone, opAppend, opStop), "APPEND to dict"},
		{"BUILD on list", pk(opProto, 4, opEmptyList, opEmptyDict, opBuild, opStop), "BUILD on list"},
		{"BUILD twice", pk(opProto, 4, sbu(data), sbu("OkMsg"), opStackGlobal, opEmptyTuple, opNewObj, opEmptyDict, opBuild, opEmptyDict, opBuild, opStop), "built twice"},
		{"BUILD with list state", pk(opProto, 4, sbu(data), sbu("OkMsg"), opStackGlobal, opEmptyTuple, opNewObj, opEmptyList, opBuild, opStop), "BUILD state is list"},
		{"STOP with two values", pk(opProto, 4, opNone, opNone, opStop), "STOP with 2 stack entries"},
		{"STOP inside MARK", pk(opProto, 4, opMark, opNone, opStop), "open MARKs"},
		{"trailing bytes", pk(opProto, 4, opNone, opStop, "junk"), "4 trailing bytes"},
		{"pop past mark", pk(opProto, 4, opNone, opMark, opPop, opStop), "stack underflow"},
		{"INST opcode", pk(opProto, 2, 'i', "os\nsystem\n", opStop), "unsupported opcode 0x69"},
		{"OBJ opcode", pk(opProto, 2, opMark, 'o', opStop), "unsupported opcode 0x6f"},
		{"PERSID opcode", pk(opProto, 2, 'P', "x\n", opStop), "unsupported opcode 0x50"},
		{"NEXT_BUFFER opcode", pk(opProto, 5, 0x97, opStop), "unsupported opcode 0x97"},
		{"EXT1 opcode", pk(opProto, 2, 0x82, 1, opStop), "unsupported opcode 0x82"},
		{"invalid UTF-8", pk(opProto, 4, opShortBinUni, 2, 0xc3, 0x28, opStop), "invalid UTF-8"},
		{"lone surrogate", pk(opProto, 4, opShortBinUni, 3, 0xed, 0xa0, 0x80, opStop), "invalid UTF-8"},
		{"codecs.encode non-latin1", pk(opProto, 2, opGlobal, "_codecs\nencode\n", sbu("\u2603"), sbu("latin1"), opTuple2, opReduce, opStop), "not in latin1"},
		{"codecs.encode other codec", pk(opProto, 2, opGlobal, "_codecs\nencode\n", sbu("x"), sbu("rot13"), opTuple2, opReduce, opStop), "unsupported arguments"},
		{"set of lists", pk(opProto, 4, opEmptySet, opMark, opEmptyList, opAddItems, opStop), "unhashable key type list"},
		{"key too large", func() []byte {
			// Nested shared tuples make a hash key that would expand to 2^13 nodes.
			b := pk(opProto, 4, opEmptyDict, opNone, opMemoize, opPop)
			for i := 0; i < 12; i++ {
				b = append(b, pk(opLongBinGet, u32le(uint32(i)), opLongBinGet, u32le(uint32(i)), opTuple2, opMemoize)...)
				if i < 11 {
					b = append(b, opPop)
				}
			}
			return append(b, pk(opNone, opSetItem, opStop)...)
		}(), "hash key too large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Decode(tt.payload)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Decode: unexpected error %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Decode accepted hostile input, got %#v", v)
			}
			if !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "nvrxwire: ") {
				t.Fatalf("error %q does not contain %q", err, tt.wantErr)
			}
			if _, err := DecodeMessage(tt.payload); err == nil {
				t.Fatal("DecodeMessage accepted hostile input")
			}
		})
	}
}

// TestDecodeMessageRejectsBadFields covers well-formed pickles whose
// attributes have the wrong shape.
func TestDecodeMessageRejectsBadFields(t *testing.T) {
	obj := func(class string, kv ...[]byte) []byte {
		b := pk(opProto, 4, sbu(DataModule), sbu(class), opStackGlobal, opEmptyTuple, opNewObj, opEmptyDict, opMark)
		for _, p := range kv {
			b = append(b, p...)
		}
		return append(b, opSetItems, opBuild)
	}
	stop := func(b []byte) []byte { return append(b, opStop) }
	tests := []struct {
		name    string
		payload []byte
		wantErr string
	}{
		{"heartbeat without rank", stop(obj("HeartbeatMsg", sbu("state"), pk(opEmptyDict))), "HeartbeatMsg: attribute rank: missing"},
		{"heartbeat rank is str", stop(obj("HeartbeatMsg", sbu("rank"), sbu("3"))), "want int, got str"},
		{"heartbeat state is list", stop(obj("HeartbeatMsg", sbu("rank"), pk(opBinInt1, 1), sbu("state"), pk(opEmptyList))), "want dict or None"},
		{"huge rank", stop(obj("HeartbeatMsg", sbu("rank"), pk(opLong1, 9, u64le(0), 1))), "out of range"},
		{"section action is int", stop(obj("SectionMsg", sbu("rank"), pk(opBinInt1, 1), sbu("section"), pk(opNone), sbu("action"), pk(opBinInt1, 1))), "want SectionAction"},
		{"init without rank_info", stop(obj("InitMsg")), "rank_info: missing"},
		{"init rank_info wrong class", stop(obj("InitMsg", sbu("rank_info"), obj("OkMsg"))), "want RankInfo"},
		{"rank_info bad env rank", stop(obj("InitMsg", sbu("rank_info"), obj("RankInfo", sbu("global_rank"), sbu("x1"), sbu("pid"), pk(opBinInt1, 1)))), "is not an integer"},
		{"update hb wrong class", stop(obj("UpdateConfigMsg", sbu("hb_timeouts"), obj("SectionTimeouts"))), "want HeartbeatTimeouts"},
		{"section timeouts non-str key", stop(obj("UpdateConfigMsg", sbu("section_timeouts"), obj("SectionTimeouts", sbu("section"), pk(opEmptyDict, opBinInt1, 1, opNone, opSetItem)))), "key is int"},
		{"reply message", stop(obj("OkMsg")), "unexpected message " + DataModule + ".OkMsg"},
		{"config class", pk(opProto, 4, sbu(ConfigModule), sbu(ConfigClass), opStackGlobal, opEmptyTuple, opNewObj, opStop), "unexpected message"},
		{"unknown control string", pk(opProto, 4, sbu("rm -rf"), opStop), `unknown control string "rm -rf"`},
		{"bare int", pk(opProto, 4, opBinInt1, 1, opStop), "unexpected message of type int"},
		{"workload tuple of 3", pk(opProto, 4, opBinInt1, 1, opNone, opNone, opTuple3, opStop), "has 3 items"},
		{"workload wrong object", pk(opProto, 4, opBinInt1, 1, obj("OkMsg"), opTuple2, opStop), "want WorkloadControlRequest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := DecodeMessage(tt.payload)
			if err == nil {
				t.Fatalf("DecodeMessage accepted it: %#v", v)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

// TestDecodeNeverPanics feeds every prefix and many single-byte mutations of
// every golden vector; each must return (value or error) without panicking.
func TestDecodeNeverPanics(t *testing.T) {
	for _, vec := range loadGolden(t) {
		p := readGolden(t, vec.File)
		for i := 0; i < len(p); i++ {
			if _, err := Decode(p[:i]); err == nil {
				t.Fatalf("%s: prefix of %d/%d bytes decoded without error", vec.File, i, len(p))
			}
		}
		m := make([]byte, len(p))
		for i := 0; i < len(p); i++ {
			for _, x := range []byte{0x00, 0xff, 0x80, byte(i)} {
				copy(m, p)
				m[i] ^= x | 1
				_, _ = DecodeMessage(m)
			}
		}
	}
}

func TestDecodeAcceptsValidEdgeCases(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
		check   func(t *testing.T, v any)
	}{
		{"depth 64 tuples", pk(opProto, 4, opEmptyTuple, repeat(MaxDepth-1, opTuple1), opStop), func(t *testing.T, v any) {
			d := 0
			for x, ok := v.(Tuple); ok; x, ok = x[0].(Tuple) {
				d++
				if len(x) == 0 {
					break
				}
			}
			if d != MaxDepth {
				t.Fatalf("depth %d", d)
			}
		}},
		{"dict equal keys merge like Python", pk(opProto, 4, opEmptyDict, opMark, opBinInt1, 1, sbu("a"), opNewTrue, sbu("b"), opBinFloat, []byte{0x3f, 0xf0, 0, 0, 0, 0, 0, 0}, sbu("c"), opSetItems, opStop), func(t *testing.T, v any) {
			d := v.(*Dict)
			if d.Len() != 1 || d.Values[0] != "c" || d.Keys[0] != int64(1) {
				t.Fatalf("got keys %v values %v", d.Keys, d.Values)
			}
		}},
		{"tuple keys", pk(opProto, 4, opEmptyDict, opBinInt1, 1, sbu("x"), opTuple2, opNone, opSetItem, opStop), func(t *testing.T, v any) {
			if _, ok := v.(*Dict).Get(Tuple{int64(1), "x"}); !ok {
				t.Fatal("tuple key not found")
			}
		}},
		{"negative LONG1 and big LONG1", pk(opProto, 2, opMark, opLong1, 1, 0xff, opLong1, 9, u64le(0), 1, opList, opStop), func(t *testing.T, v any) {
			l := v.([]any)
			if l[0] != int64(-1) || typeName(l[1]) != "int" || l[1].(interface{ String() string }).String() != "18446744073709551616" {
				t.Fatalf("got %#v", l)
			}
		}},
		{"text PUT/GET and DICT", pk(opProto, 2, opMark, sbu("k"), sbu("v"), opDict, opPut, "5\n", opPop, opGet, "5\n", opStop), func(t *testing.T, v any) {
			if got, _ := v.(*Dict).Get("k"); got != "v" {
				t.Fatalf("got %#v", got)
			}
		}},
		{"NEWOBJ_EX", pk(opProto, 4, sbu(DataModule), sbu("OkMsg"), opStackGlobal, opEmptyTuple, opEmptyDict, 0x92, opStop), func(t *testing.T, v any) {
			if o := v.(*Object); o.Name != "OkMsg" || o.Kwargs == nil {
				t.Fatalf("got %#v", o)
			}
		}},
		{"enum member by qualified name", pk(opProto, 4, sbu(DataModule), sbu("WorkloadAction.ShutdownWorkload"), opStackGlobal, opStop), func(t *testing.T, v any) {
			if n, _ := v.(*Object).EnumValue(); n != 2 {
				t.Fatalf("got %d", n)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Decode(tt.payload)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			tt.check(t, v)
		})
	}
}
