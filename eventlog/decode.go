package eventlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Entry is one decoded line of an event log.
type Entry struct {
	Event string    // the kind
	TS    time.Time // when it was written
	// The log's base fields (cmd/ft-launcher's eventBase): the writer's
	// node (or, in a round_ended, the node that ended the round), run id
	// and Slurm job id ("" when absent).
	Node       string
	RunID      string
	SlurmJobID string
	// Record is the typed record of the kind (a value of one of the types
	// Typed lists), or Unknown holding every field of a kind this package
	// has no type for (a newer writer's).
	Record Record
}

// ErrNotEvent: a JSON object that is not an ft-launcher event (no event
// kind or no ts).
var ErrNotEvent = errors.New("not an ft-launcher event (no event kind or ts)")

// header is the part of every line that is not the record's own. Its
// fields are read leniently (a value of another JSON type is absent), as
// readers always did.
type header struct {
	Event      any `json:"event"`
	TS         any `json:"ts"`
	Node       any `json:"node"`
	RunID      any `json:"run_id"`
	SlurmJobID any `json:"slurm_job_id"`
}

// RecordError: a line's fields do not fit its kind's record (a field with
// the wrong JSON type). Decode returns it with the entry, whose Record is
// then Unknown holding every field, so a reader may go on without it.
type RecordError struct {
	Kind string
	Err  error
}

func (e *RecordError) Error() string { return e.Kind + " record: " + e.Err.Error() }
func (e *RecordError) Unwrap() error { return e.Err }

// Decode reads one line of an event log: its header and its typed record.
// A line that is not a JSON object is an error wrapping the JSON error; a
// JSON object without an event kind or a ts is ErrNotEvent; a field of a
// typed record whose value has the wrong JSON type is a *RecordError,
// returned with the entry. Fields a record does not know are ignored (a
// newer writer).
func Decode(line []byte) (Entry, error) {
	var h header
	if err := json.Unmarshal(line, &h); err != nil {
		return Entry{}, err
	}
	str := func(v any) string { s, _ := v.(string); return s }
	kind := str(h.Event)
	ts, err := time.Parse(time.RFC3339Nano, str(h.TS))
	if err != nil || kind == "" {
		return Entry{}, ErrNotEvent
	}
	e := Entry{Event: kind, TS: ts, Node: str(h.Node), RunID: str(h.RunID), SlurmJobID: jobID(h.SlurmJobID)}
	var recErr error
	if t := typeOf(kind); t != nil {
		p := reflect.New(t)
		err := json.Unmarshal(line, p.Interface())
		if err == nil {
			e.Record = p.Elem().Interface().(Record)
			return e, nil
		}
		recErr = &RecordError{Kind: kind, Err: err}
	}
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil {
		return Entry{}, err
	}
	e.Record = Unknown{Event: kind, Fields: m}
	return e, recErr
}

// Unknown is what Decode returns for a line whose kind has no typed
// record (a newer writer's) or whose fields do not fit its record: every
// field of the line, as encoding/json reads them into a map. It is never
// written: Emit takes typed records only, and would write an Unknown's
// kind without its fields.
type Unknown struct {
	Event  string         `json:"-"`
	Fields map[string]any `json:"-"`
}

// Kind returns the event kind.
func (u Unknown) Kind() string { return u.Event }

// typeOf is the record type of kind; nil when it has none.
func typeOf(kind string) reflect.Type {
	for _, r := range Typed() {
		if r.Kind() == kind {
			return reflect.TypeOf(r)
		}
	}
	return nil
}

// jobID renders a Slurm job id written as a string or a number.
func jobID(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return fmt.Sprintf("%.0f", x)
	}
	return ""
}

type jsonField struct {
	name      string
	omitempty bool
	index     int // in the struct
}

// jsonFields lists a record type's JSON fields.
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for i := range t.NumField() {
		tag := t.Field(i).Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !t.Field(i).IsExported() {
			continue
		}
		if name == "" {
			name = t.Field(i).Name
		}
		out = append(out, jsonField{name: name, omitempty: strings.Contains(opts, "omitempty"), index: i})
	}
	return out
}
