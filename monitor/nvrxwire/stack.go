package nvrxwire

// The unpickler's machine state: pushing and popping its stack, MARK groups
// and memo, and building containers from what it pops. Container building is
// where the limits (Max*) and sealing are enforced: a container is sealed once
// referenced, so it never changes afterwards and no cycle can form.

func (d *decoder) push(v any) error {
	if len(d.stack) >= MaxStack {
		return d.errf("stack exceeds %d entries", MaxStack)
	}
	d.stack = append(d.stack, v)
	return nil
}

func (d *decoder) pop() (any, error) {
	lo := 0
	if n := len(d.marks); n > 0 {
		lo = d.marks[n-1]
	}
	if len(d.stack) <= lo {
		return nil, d.errf("stack underflow")
	}
	v := d.stack[len(d.stack)-1]
	d.stack = d.stack[:len(d.stack)-1]
	return v, nil
}

func (d *decoder) top() (any, error) {
	lo := 0
	if n := len(d.marks); n > 0 {
		lo = d.marks[n-1]
	}
	if len(d.stack) <= lo {
		return nil, d.errf("stack underflow")
	}
	return d.stack[len(d.stack)-1], nil
}

// popMark removes and returns the items above the innermost MARK. The
// returned slice is a copy, so it stays valid as the stack grows again.
func (d *decoder) popMark() ([]any, error) {
	n := len(d.marks)
	if n == 0 {
		return nil, d.errf("MARK missing")
	}
	m := d.marks[n-1]
	d.marks = d.marks[:n-1]
	items := make([]any, len(d.stack)-m)
	copy(items, d.stack[m:])
	clear(d.stack[m:])
	d.stack = d.stack[:m]
	if len(items) > MaxContainerItems {
		return nil, d.errf("%d items after MARK exceed %d", len(items), MaxContainerItems)
	}
	return items, nil
}

// adopt records that parent now references child: child becomes immutable
// (sealed), and parent's depth and expanded size are updated and checked.
// Sealing on first reference makes reference cycles impossible: a container
// can only be mutated while nothing references it, so it can never end up
// inside itself.
func (d *decoder) adopt(parent *meta, child any) error {
	if g, ok := child.(*globalRef); ok {
		return d.errf("global %s used as a value", g)
	}
	if t, ok := child.(*tupleV); ok && t.hasGlobal {
		return d.errf("tuple holding a global used as a value")
	}
	if m, ok := child.(metered); ok {
		cm := m.info()
		if cm == parent {
			return d.errf("recursive structure")
		}
		cm.sealed = true
	}
	cd, cs := depthSize(child)
	if cd+1 > parent.depth {
		parent.depth = cd + 1
	}
	if parent.depth > MaxDepth {
		return d.errf("nesting deeper than %d", MaxDepth)
	}
	parent.size += cs
	if parent.size > MaxNodes {
		return d.errf("value expands to more than %d nodes", MaxNodes)
	}
	return nil
}

// newTuple builds a tuple. A tuple may hold whitelisted globals only as the
// argument list of a REDUCE (getattr(EnumClass, name)); such a tuple is
// flagged and refused anywhere else.
func (d *decoder) newTuple(items []any) (*tupleV, error) {
	t := &tupleV{items: items}
	t.size = 1
	for _, it := range items {
		if _, ok := it.(*globalRef); ok {
			t.hasGlobal = true
			t.size++
			continue
		}
		if err := d.adopt(&t.meta, it); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (d *decoder) mutable(m *meta, what string) error {
	if m.sealed {
		return d.errf("%s modified after being referenced", what)
	}
	return nil
}

func (d *decoder) memoPut(idx uint32, v any) error {
	if _, ok := d.memo[idx]; !ok && len(d.memo) >= MaxMemo {
		return d.errf("memo exceeds %d entries", MaxMemo)
	}
	d.memo[idx] = v
	return nil
}

func (d *decoder) pushGlobal(module, name string) error {
	g := lookupGlobal(module, name)
	if g == nil {
		return d.errf("unknown global %s.%s", module, name)
	}
	if g.kind == kindConst {
		return d.push(g.value)
	}
	return d.push(g)
}

func (d *decoder) appendTo(t any, items []any) error {
	l, ok := t.(*listV)
	if !ok {
		return d.errf("APPEND to %s", typeName(t))
	}
	return d.appendItems(l, items)
}

func (d *decoder) appendItems(l *listV, items []any) error {
	if err := d.mutable(&l.meta, "list"); err != nil {
		return err
	}
	if len(l.items)+len(items) > MaxContainerItems {
		return d.errf("list exceeds %d items", MaxContainerItems)
	}
	for _, it := range items {
		if err := d.adopt(&l.meta, it); err != nil {
			return err
		}
	}
	l.items = append(l.items, items...)
	return nil
}

func (d *decoder) setItems(m *Dict, items []any) error {
	if err := d.mutable(&m.meta, "dict"); err != nil {
		return err
	}
	if len(items)%2 != 0 {
		return d.errf("odd number of items (%d) for dict", len(items))
	}
	for i := 0; i < len(items); i += 2 {
		k, v := items[i], items[i+1]
		if err := d.adopt(&m.meta, k); err != nil {
			return err
		}
		if err := d.adopt(&m.meta, v); err != nil {
			return err
		}
		if err := m.set(k, v); err != nil {
			return d.errf("dict: %v", err)
		}
	}
	return nil
}

func (d *decoder) addItems(s *Set, items []any) error {
	if err := d.mutable(&s.meta, "set"); err != nil {
		return err
	}
	for _, it := range items {
		if err := d.adopt(&s.meta, it); err != nil {
			return err
		}
		if err := s.add(it); err != nil {
			return d.errf("set: %v", err)
		}
	}
	return nil
}
