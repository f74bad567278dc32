package nvrxwire

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Limits of the restricted unpickler. Real nvrx messages are a few hundred
// bytes with nesting depth <= 4; these bounds only stop hostile input.
const (
	MaxDepth          = 64      // nesting of containers and of MARKs
	MaxContainerItems = 1 << 16 // items in one list, tuple, dict, set or MARK group
	MaxMemo           = 1 << 16 // memo entries
	MaxStack          = 1 << 16 // unpickler stack entries
	MaxNodes          = 1 << 20 // nodes of one value with shared references expanded
	maxLongBytes      = 256     // LONG4 payload; nvrx never sends huge ints
	maxKeyNodes       = 1024    // expanded size of a tuple used as a dict key or set item
	maxLineLen        = 512     // GLOBAL/PUT/GET text lines
)

// Tuple is a decoded Python tuple.
type Tuple []any

// ByteArray is a decoded Python bytearray (unhashable, unlike []byte).
type ByteArray []byte

// meta tracks, for every container built while decoding, whether it is
// already referenced by another container (sealed: no further mutation, which
// rules out reference cycles), its nesting depth and its expanded size.
type meta struct {
	sealed bool
	depth  int
	size   int
}

func (m *meta) info() *meta { return m }

type metered interface{ info() *meta }

// Dict is a decoded Python dict; Keys and Values are parallel and keep
// insertion order. Re-setting an equal key replaces its value, as in Python.
type Dict struct {
	Keys   []any
	Values []any
	index  map[string]int
	meta
}

// Len returns the number of entries.
func (d *Dict) Len() int {
	if d == nil {
		return 0
	}
	return len(d.Keys)
}

// Get returns the value stored under key, using Python equality for
// hashable scalars (1 == 1.0 == True).
func (d *Dict) Get(key any) (any, bool) {
	if d == nil {
		return nil, false
	}
	h, err := hashKey(key)
	if err != nil {
		return nil, false
	}
	i, ok := d.index[h]
	if !ok {
		return nil, false
	}
	return d.Values[i], true
}

func (d *Dict) set(k, v any) error {
	h, err := hashKey(k)
	if err != nil {
		return err
	}
	if d.index == nil {
		d.index = make(map[string]int)
	}
	if i, ok := d.index[h]; ok {
		d.Values[i] = v
		return nil
	}
	if len(d.Keys) >= MaxContainerItems {
		return fmt.Errorf("dict exceeds %d items", MaxContainerItems)
	}
	d.index[h] = len(d.Keys)
	d.Keys = append(d.Keys, k)
	d.Values = append(d.Values, v)
	return nil
}

// Set is a decoded Python set or frozenset.
type Set struct {
	Items     []any
	Frozenset bool
	index     map[string]struct{}
	meta
}

// Has reports whether the set holds an item equal to v.
func (s *Set) Has(v any) bool {
	if s == nil {
		return false
	}
	h, err := hashKey(v)
	if err != nil {
		return false
	}
	_, ok := s.index[h]
	return ok
}

func (s *Set) add(v any) error {
	h, err := hashKey(v)
	if err != nil {
		return err
	}
	if s.index == nil {
		s.index = make(map[string]struct{})
	}
	if _, ok := s.index[h]; ok {
		return nil
	}
	if len(s.Items) >= MaxContainerItems {
		return fmt.Errorf("set exceeds %d items", MaxContainerItems)
	}
	s.index[h] = struct{}{}
	s.Items = append(s.Items, v)
	return nil
}

// Object is an instance of a whitelisted class. For a class built with NEWOBJ
// Args are the __new__ arguments (normally empty) and State is what BUILD
// gave (normally a *Dict with the instance __dict__). Enum members are
// Objects whose Args hold the single member value.
type Object struct {
	Module, Name string
	Args         Tuple
	Kwargs       *Dict
	State        any
	meta
}

// Attrs returns the instance __dict__: State itself, or the dict part of a
// (dict, slots) state tuple, merged.
func (o *Object) Attrs() *Dict {
	switch st := o.State.(type) {
	case *Dict:
		return st
	case Tuple:
		merged := &Dict{}
		for _, part := range st {
			if d, ok := part.(*Dict); ok {
				for i, k := range d.Keys {
					// Keys were hashable when first inserted.
					_ = merged.set(k, d.Values[i])
				}
			}
		}
		return merged
	}
	return &Dict{}
}

// EnumValue returns the member value of an enum Object.
func (o *Object) EnumValue() (int64, bool) {
	if o == nil || len(o.Args) != 1 {
		return 0, false
	}
	v, ok := o.Args[0].(int64)
	return v, ok
}

// listV and tupleV are the in-flight forms of lists and tuples; they carry
// identity and meta while decoding and become []any and Tuple at the end.
type listV struct {
	items []any
	meta
}

type tupleV struct {
	items     []any
	hasGlobal bool // holds a whitelisted global: only valid as REDUCE args
	meta
}

// depthSize returns a value's nesting depth and expanded node count.
func depthSize(v any) (int, int) {
	if m, ok := v.(metered); ok {
		mi := m.info()
		return mi.depth, mi.size
	}
	return 0, 1
}

// hashKey maps a hashable value to a string such that values Python
// considers equal (and hashable) map to the same key.
func hashKey(v any) (string, error) {
	var b strings.Builder
	budget := maxKeyNodes
	if err := writeHashKey(&b, v, &budget); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeHashKey(b *strings.Builder, v any, budget *int) error {
	*budget--
	if *budget < 0 {
		return fmt.Errorf("hash key too large")
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("N;")
	case bool:
		if x {
			b.WriteString("i1;")
		} else {
			b.WriteString("i0;")
		}
	case int64:
		b.WriteString("i")
		b.WriteString(strconv.FormatInt(x, 10))
		b.WriteString(";")
	case *big.Int:
		b.WriteString("i")
		b.WriteString(x.String())
		b.WriteString(";")
	case float64:
		if x == math.Trunc(x) && x >= -(1<<63) && x < 1<<63 {
			b.WriteString("i")
			b.WriteString(strconv.FormatInt(int64(x), 10))
			b.WriteString(";")
		} else if x == math.Trunc(x) && !math.IsInf(x, 0) {
			bi, _ := new(big.Float).SetFloat64(x).Int(nil)
			b.WriteString("i")
			b.WriteString(bi.String())
			b.WriteString(";")
		} else {
			b.WriteString("f")
			b.WriteString(strconv.FormatUint(math.Float64bits(x), 16))
			b.WriteString(";")
		}
	case string:
		b.WriteString("s")
		b.WriteString(strconv.Itoa(len(x)))
		b.WriteString(":")
		b.WriteString(x)
	case []byte:
		b.WriteString("b")
		b.WriteString(strconv.Itoa(len(x)))
		b.WriteString(":")
		b.Write(x)
	case *tupleV:
		return writeTupleKey(b, x.items, budget)
	case Tuple:
		return writeTupleKey(b, x, budget)
	default:
		return fmt.Errorf("unhashable key type %s", typeName(v))
	}
	return nil
}

func writeTupleKey(b *strings.Builder, items []any, budget *int) error {
	b.WriteString("t(")
	for _, it := range items {
		if err := writeHashKey(b, it, budget); err != nil {
			return err
		}
	}
	b.WriteString(")")
	return nil
}

// typeName names a decoded value's Python type for error messages.
func typeName(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case ByteArray:
		return "bytearray"
	case *listV, []any:
		return "list"
	case *tupleV, Tuple:
		return "tuple"
	case *Dict:
		return "dict"
	case *Set:
		if x.Frozenset {
			return "frozenset"
		}
		return "set"
	case *Object:
		return x.Module + "." + x.Name
	case *globalRef:
		return "global " + x.String()
	}
	return fmt.Sprintf("%T", v)
}

// finalize converts in-flight lists and tuples to []any and Tuple throughout
// the value. done maps each container already converted to its result, so a
// value with shared references is walked once per distinct node.
func finalize(v any, done map[any]any) any {
	switch x := v.(type) {
	case *listV:
		if r, ok := done[x]; ok {
			return r
		}
		out := make([]any, len(x.items))
		done[x] = out
		for i, it := range x.items {
			out[i] = finalize(it, done)
		}
		return out
	case *tupleV:
		if r, ok := done[x]; ok {
			return r
		}
		out := make(Tuple, len(x.items))
		done[x] = out
		for i, it := range x.items {
			out[i] = finalize(it, done)
		}
		return out
	case *Dict:
		if _, ok := done[x]; ok {
			return x
		}
		done[x] = x
		for i := range x.Keys {
			x.Keys[i] = finalize(x.Keys[i], done)
			x.Values[i] = finalize(x.Values[i], done)
		}
		return x
	case *Set:
		if _, ok := done[x]; ok {
			return x
		}
		done[x] = x
		for i := range x.Items {
			x.Items[i] = finalize(x.Items[i], done)
		}
		return x
	case *Object:
		if _, ok := done[x]; ok {
			return x
		}
		done[x] = x
		for i := range x.Args {
			x.Args[i] = finalize(x.Args[i], done)
		}
		if x.Kwargs != nil {
			finalize(x.Kwargs, done)
		}
		x.State = finalize(x.State, done)
		return x
	}
	return v
}

// describe renders a scalar for an error message without dumping big values.
func describe(v any) string {
	switch x := v.(type) {
	case int64:
		return strconv.FormatInt(x, 10)
	case string:
		if len(x) > 40 {
			x = x[:40] + "..."
		}
		return strconv.Quote(x)
	}
	return typeName(v)
}
