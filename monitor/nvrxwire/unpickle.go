package nvrxwire

// This file is the restricted unpickler's interpreter: the opcode table,
// Decode, the run loop and step, which is one switch over every opcode, with
// the readers of the opcodes' inline arguments. It is kept whole, over the
// usual ~600 lines, because that switch is the decoder's specification: read
// top to bottom it lists every opcode accepted and what each may do, and
// splitting it by opcode family would scatter that audit across files. The
// stack, memo and container building it drives are in stack.go, REDUCE's
// whitelisted callables in globals.go, and the decoded values in values.go.

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"unicode/utf8"
)

// Pickle opcodes understood by the decoder (names as in CPython's pickletools).
const (
	opMark          = '('
	opStop          = '.'
	opPop           = '0'
	opPopMark       = '1'
	opDup           = '2'
	opBinInt        = 'J'
	opBinInt1       = 'K'
	opBinInt2       = 'M'
	opNone          = 'N'
	opBinUnicode    = 'X'
	opAppend        = 'a'
	opBuild         = 'b'
	opGlobal        = 'c'
	opDict          = 'd'
	opEmptyDict     = '}'
	opAppends       = 'e'
	opGet           = 'g'
	opBinGet        = 'h'
	opLongBinGet    = 'j'
	opList          = 'l'
	opEmptyList     = ']'
	opPut           = 'p'
	opBinPut        = 'q'
	opLongBinPut    = 'r'
	opSetItem       = 's'
	opTuple         = 't'
	opEmptyTuple    = ')'
	opSetItems      = 'u'
	opBinFloat      = 'G'
	opReduce        = 'R'
	opBinBytes      = 'B'
	opShortBinBytes = 'C'
	opProto         = 0x80
	opNewObj        = 0x81
	opTuple1        = 0x85
	opTuple2        = 0x86
	opTuple3        = 0x87
	opNewTrue       = 0x88
	opNewFalse      = 0x89
	opLong1         = 0x8a
	opLong4         = 0x8b
	opShortBinUni   = 0x8c
	opBinUnicode8   = 0x8d
	opBinBytes8     = 0x8e
	opEmptySet      = 0x8f
	opAddItems      = 0x90
	opFrozenSet     = 0x91
	opNewObjEx      = 0x92
	opStackGlobal   = 0x93
	opMemoize       = 0x94
	opFrame         = 0x95
	opByteArray8    = 0x96
	highestProtocol = 5
)

// Decode runs the restricted unpickler over one pickle payload and returns
// the decoded value: nil, bool, int64, *big.Int (only beyond int64), float64,
// string, []byte, ByteArray, []any, Tuple, *Dict, *Set or *Object.
// Only whitelisted globals are accepted and none of them is ever called;
// anything else is an error. Decode never panics on any input.
func Decode(payload []byte) (any, error) {
	d := &decoder{data: payload, memo: make(map[uint32]any, 16)}
	v, err := d.run()
	if err != nil {
		return nil, err
	}
	return finalize(v, make(map[any]any)), nil
}

type decoder struct {
	data  []byte
	pos   int // offset of the next byte to read
	op    int // offset of the opcode being executed, for errors
	stack []any
	marks []int
	memo  map[uint32]any
}

func (d *decoder) errf(format string, args ...any) error {
	return fmt.Errorf("nvrxwire: "+format+" (opcode at offset %d)", append(args, d.op)...)
}

func (d *decoder) truncated() error {
	return fmt.Errorf("nvrxwire: truncated at offset %d", len(d.data))
}

// take returns the next n bytes without copying; n is checked against the
// remaining input before anything is allocated.
func (d *decoder) take(n uint64) ([]byte, error) {
	if n > uint64(len(d.data)-d.pos) {
		return nil, d.truncated()
	}
	b := d.data[d.pos : d.pos+int(n)]
	d.pos += int(n)
	return b, nil
}

func (d *decoder) byte1() (byte, error) {
	b, err := d.take(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (d *decoder) u16() (uint64, error) {
	b, err := d.take(2)
	if err != nil {
		return 0, err
	}
	return uint64(binary.LittleEndian.Uint16(b)), nil
}

func (d *decoder) u32() (uint64, error) {
	b, err := d.take(4)
	if err != nil {
		return 0, err
	}
	return uint64(binary.LittleEndian.Uint32(b)), nil
}

func (d *decoder) u64() (uint64, error) {
	b, err := d.take(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// line reads a '\n'-terminated text argument (GLOBAL, PUT, GET).
func (d *decoder) line() (string, error) {
	for i := d.pos; i < len(d.data) && i-d.pos <= maxLineLen; i++ {
		if d.data[i] == '\n' {
			s := string(d.data[d.pos:i])
			d.pos = i + 1
			if !utf8.ValidString(s) {
				return "", d.errf("invalid UTF-8 in text argument")
			}
			return s, nil
		}
	}
	if len(d.data)-d.pos > maxLineLen {
		return "", d.errf("text argument longer than %d bytes", maxLineLen)
	}
	return "", d.truncated()
}

func (d *decoder) run() (any, error) {
	for {
		d.op = d.pos
		op, err := d.byte1()
		if err != nil {
			return nil, err
		}
		if op == opStop {
			if len(d.marks) != 0 || len(d.stack) != 1 {
				return nil, d.errf("STOP with %d stack entries and %d open MARKs", len(d.stack), len(d.marks))
			}
			if d.pos != len(d.data) {
				return nil, d.errf("%d trailing bytes after STOP", len(d.data)-d.pos)
			}
			v := d.stack[0]
			if g, ok := v.(*globalRef); ok {
				return nil, d.errf("global %s used as a value", g)
			}
			if t, ok := v.(*tupleV); ok && t.hasGlobal {
				return nil, d.errf("tuple holding a global used as a value")
			}
			return v, nil
		}
		if err := d.step(op); err != nil {
			return nil, err
		}
	}
}

func (d *decoder) step(op byte) error {
	switch op {
	case opProto:
		p, err := d.byte1()
		if err != nil {
			return err
		}
		if p > highestProtocol {
			return d.errf("unsupported pickle protocol %d", p)
		}
		return nil
	case opFrame:
		n, err := d.u64()
		if err != nil {
			return err
		}
		if n > uint64(len(d.data)-d.pos) {
			return d.truncated()
		}
		return nil // frames only batch reads; the payload is already in memory
	case opMark:
		if len(d.marks) >= MaxDepth {
			return d.errf("more than %d nested MARKs", MaxDepth)
		}
		d.marks = append(d.marks, len(d.stack))
		return nil
	case opPop:
		_, err := d.pop()
		return err
	case opPopMark:
		_, err := d.popMark()
		return err
	case opDup:
		v, err := d.top()
		if err != nil {
			return err
		}
		return d.push(v)

	case opNone:
		return d.push(nil)
	case opNewTrue:
		return d.push(true)
	case opNewFalse:
		return d.push(false)
	case opBinInt:
		n, err := d.u32()
		if err != nil {
			return err
		}
		return d.push(int64(int32(uint32(n))))
	case opBinInt1:
		b, err := d.byte1()
		if err != nil {
			return err
		}
		return d.push(int64(b))
	case opBinInt2:
		n, err := d.u16()
		if err != nil {
			return err
		}
		return d.push(int64(n))
	case opLong1, opLong4:
		var n uint64
		var err error
		if op == opLong1 {
			var b byte
			b, err = d.byte1()
			n = uint64(b)
		} else {
			n, err = d.u32()
			if err == nil && n > maxLongBytes {
				return d.errf("LONG4 of %d bytes exceeds %d", n, maxLongBytes)
			}
		}
		if err != nil {
			return err
		}
		b, err := d.take(n)
		if err != nil {
			return err
		}
		return d.push(decodeLong(b))
	case opBinFloat:
		b, err := d.take(8)
		if err != nil {
			return err
		}
		return d.push(math.Float64frombits(binary.BigEndian.Uint64(b)))

	case opShortBinUni, opBinUnicode, opBinUnicode8:
		n, err := d.length(op == opShortBinUni, op == opBinUnicode8)
		if err != nil {
			return err
		}
		b, err := d.take(n)
		if err != nil {
			return err
		}
		if !utf8.Valid(b) {
			return d.errf("invalid UTF-8 in string")
		}
		return d.push(string(b))
	case opShortBinBytes, opBinBytes, opBinBytes8, opByteArray8:
		n, err := d.length(op == opShortBinBytes, op == opBinBytes8 || op == opByteArray8)
		if err != nil {
			return err
		}
		b, err := d.take(n)
		if err != nil {
			return err
		}
		c := make([]byte, len(b))
		copy(c, b)
		if op == opByteArray8 {
			return d.push(ByteArray(c))
		}
		return d.push(c)

	case opMemoize:
		v, err := d.top()
		if err != nil {
			return err
		}
		return d.memoPut(uint32(len(d.memo)), v)
	case opPut, opBinPut, opLongBinPut:
		idx, err := d.memoIndex(op == opPut, op == opBinPut)
		if err != nil {
			return err
		}
		v, err := d.top()
		if err != nil {
			return err
		}
		return d.memoPut(idx, v)
	case opGet, opBinGet, opLongBinGet:
		idx, err := d.memoIndex(op == opGet, op == opBinGet)
		if err != nil {
			return err
		}
		v, ok := d.memo[idx]
		if !ok {
			return d.errf("memo key %d missing", idx)
		}
		return d.push(v)

	case opGlobal:
		module, err := d.line()
		if err != nil {
			return err
		}
		name, err := d.line()
		if err != nil {
			return err
		}
		return d.pushGlobal(module, name)
	case opStackGlobal:
		nv, err := d.pop()
		if err != nil {
			return err
		}
		mv, err := d.pop()
		if err != nil {
			return err
		}
		module, ok1 := mv.(string)
		name, ok2 := nv.(string)
		if !ok1 || !ok2 {
			return d.errf("STACK_GLOBAL needs two str, got %s and %s", typeName(mv), typeName(nv))
		}
		return d.pushGlobal(module, name)

	case opEmptyTuple:
		return d.push(&tupleV{meta: meta{size: 1}})
	case opTuple1, opTuple2, opTuple3:
		n := int(op-opTuple1) + 1
		lo := 0
		if k := len(d.marks); k > 0 {
			lo = d.marks[k-1]
		}
		if len(d.stack)-lo < n {
			return d.errf("stack underflow")
		}
		items := make([]any, n)
		copy(items, d.stack[len(d.stack)-n:])
		clear(d.stack[len(d.stack)-n:])
		d.stack = d.stack[:len(d.stack)-n]
		t, err := d.newTuple(items)
		if err != nil {
			return err
		}
		return d.push(t)
	case opTuple:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		t, err := d.newTuple(items)
		if err != nil {
			return err
		}
		return d.push(t)

	case opEmptyList:
		return d.push(&listV{meta: meta{size: 1}})
	case opList:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		l := &listV{meta: meta{size: 1}}
		if err := d.appendItems(l, items); err != nil {
			return err
		}
		return d.push(l)
	case opAppend:
		v, err := d.pop()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		return d.appendTo(t, []any{v})
	case opAppends:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		return d.appendTo(t, items)

	case opEmptyDict:
		return d.push(&Dict{meta: meta{size: 1}})
	case opDict:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		m := &Dict{meta: meta{size: 1}}
		if err := d.setItems(m, items); err != nil {
			return err
		}
		return d.push(m)
	case opSetItem:
		v, err := d.pop()
		if err != nil {
			return err
		}
		k, err := d.pop()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		m, ok := t.(*Dict)
		if !ok {
			return d.errf("SETITEM on %s", typeName(t))
		}
		return d.setItems(m, []any{k, v})
	case opSetItems:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		m, ok := t.(*Dict)
		if !ok {
			return d.errf("SETITEMS on %s", typeName(t))
		}
		return d.setItems(m, items)

	case opEmptySet:
		return d.push(&Set{meta: meta{size: 1}})
	case opAddItems:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		s, ok := t.(*Set)
		if !ok || s.Frozenset {
			return d.errf("ADDITEMS on %s", typeName(t))
		}
		return d.addItems(s, items)
	case opFrozenSet:
		items, err := d.popMark()
		if err != nil {
			return err
		}
		s := &Set{Frozenset: true, meta: meta{size: 1}}
		if err := d.addItems(s, items); err != nil {
			return err
		}
		return d.push(s)

	case opNewObj, opNewObjEx:
		var kwargs *Dict
		if op == opNewObjEx {
			kv, err := d.pop()
			if err != nil {
				return err
			}
			k, ok := kv.(*Dict)
			if !ok {
				return d.errf("NEWOBJ_EX kwargs is %s, not dict", typeName(kv))
			}
			kwargs = k
		}
		av, err := d.pop()
		if err != nil {
			return err
		}
		args, ok := av.(*tupleV)
		if !ok {
			return d.errf("NEWOBJ args is %s, not tuple", typeName(av))
		}
		cv, err := d.pop()
		if err != nil {
			return err
		}
		g, ok := cv.(*globalRef)
		if !ok {
			return d.errf("NEWOBJ of %s", typeName(cv))
		}
		if g.kind != kindClass {
			return d.errf("NEWOBJ of non-class global %s", g)
		}
		o := &Object{Module: g.module, Name: g.name, meta: meta{size: 1}}
		if err := d.adopt(&o.meta, args); err != nil {
			return err
		}
		o.Args = Tuple(args.items)
		if kwargs != nil {
			if err := d.adopt(&o.meta, kwargs); err != nil {
				return err
			}
			o.Kwargs = kwargs
		}
		return d.push(o)
	case opReduce:
		av, err := d.pop()
		if err != nil {
			return err
		}
		cv, err := d.pop()
		if err != nil {
			return err
		}
		args, ok := av.(*tupleV)
		if !ok {
			return d.errf("REDUCE args is %s, not tuple", typeName(av))
		}
		g, ok := cv.(*globalRef)
		if !ok {
			return d.errf("REDUCE of %s", typeName(cv))
		}
		v, err := d.reduce(g, args.items)
		if err != nil {
			return err
		}
		return d.push(v)
	case opBuild:
		st, err := d.pop()
		if err != nil {
			return err
		}
		t, err := d.top()
		if err != nil {
			return err
		}
		o, ok := t.(*Object)
		if !ok {
			return d.errf("BUILD on %s", typeName(t))
		}
		if err := d.mutable(&o.meta, "object "+o.Module+"."+o.Name); err != nil {
			return err
		}
		if o.State != nil {
			return d.errf("object %s.%s built twice", o.Module, o.Name)
		}
		switch s := st.(type) {
		case *Dict:
		case *tupleV:
			if len(s.items) != 2 {
				return d.errf("BUILD state tuple of length %d", len(s.items))
			}
			for _, part := range s.items {
				if _, ok := part.(*Dict); !ok && part != nil {
					return d.errf("BUILD state tuple holds %s", typeName(part))
				}
			}
		default:
			return d.errf("BUILD state is %s", typeName(st))
		}
		if err := d.adopt(&o.meta, st); err != nil {
			return err
		}
		o.State = st
		return nil
	}
	return d.errf("unsupported opcode 0x%02x", op)
}

// length reads a string/bytes length prefix: 1 byte, 4 bytes or 8 bytes.
func (d *decoder) length(short, long bool) (uint64, error) {
	switch {
	case short:
		b, err := d.byte1()
		return uint64(b), err
	case long:
		return d.u64()
	default:
		return d.u32()
	}
}

func (d *decoder) memoIndex(text, short bool) (uint32, error) {
	switch {
	case text:
		s, err := d.line()
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return 0, d.errf("bad memo index %q", s)
		}
		return uint32(n), nil
	case short:
		b, err := d.byte1()
		return uint32(b), err
	default:
		n, err := d.u32()
		return uint32(n), err
	}
}

// decodeLong decodes a little-endian two's-complement integer, as LONG1 and
// LONG4 carry it; values that fit int64 are returned as int64.
func decodeLong(b []byte) any {
	if len(b) == 0 {
		return int64(0)
	}
	if len(b) <= 8 {
		var u uint64
		for i := len(b) - 1; i >= 0; i-- {
			u = u<<8 | uint64(b[i])
		}
		shift := 64 - 8*uint(len(b))
		return int64(u<<shift) >> shift
	}
	be := make([]byte, len(b))
	for i, c := range b {
		be[len(b)-1-i] = c
	}
	n := new(big.Int).SetBytes(be)
	if b[len(b)-1]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	if n.IsInt64() {
		return n.Int64()
	}
	return n
}
