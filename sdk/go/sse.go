package space

import (
	"bufio"
	"bytes"
	"io"
	"strings"
)

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	ID    string // the last event ID in effect (ids persist across events)
	Event string // "message" when the server names none
	Data  string // data lines joined with "\n"
}

// sseReader parses a text/event-stream as the WHATWG HTML spec describes:
// lines end in CRLF, LF or CR; lines starting with ':' are comments; "data"
// lines accumulate; a blank line dispatches; an event with no data is dropped;
// an unterminated event at end of stream is discarded.
type sseReader struct {
	sc     *bufio.Scanner
	lastID string
}

// maxSSELine bounds one line of the stream (one output chunk, base64'd).
const maxSSELine = 16 << 20

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	sc.Split((&lineSplitter{}).split)
	return &sseReader{sc: sc}
}

// lineSplitter splits on CRLF, LF or a lone CR (a bufio.SplitFunc with a
// memory). An output chunk is one line of a MiB or more that arrives in
// many reads, and the Scanner hands the split function the whole line so
// far after each: checked is how much of it is known to hold no line end,
// so each byte is looked at once.
type lineSplitter struct{ checked int }

func (l *lineSplitter) split(data []byte, atEOF bool) (int, []byte, error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	rest := data[l.checked:]
	i := bytes.IndexByte(rest, '\n')
	if i < 0 {
		i = len(rest)
	}
	if j := bytes.IndexByte(rest[:i], '\r'); j >= 0 {
		i = j
	}
	if i < len(rest) {
		i += l.checked
		if data[i] == '\n' {
			return l.token(i+1, data[:i])
		}
		// CR: swallow a following LF, which may not have arrived yet.
		if i+1 < len(data) {
			if data[i+1] == '\n' {
				return l.token(i+2, data[:i])
			}
			return l.token(i+1, data[:i])
		}
		if atEOF {
			return l.token(i+1, data[:i])
		}
		l.checked = i
		return 0, nil, nil
	}
	if atEOF {
		// A final line without terminator never completes an event, but hand
		// it over so the caller sees a consistent stream.
		return l.token(len(data), data)
	}
	l.checked = len(data)
	return 0, nil, nil
}

func (l *lineSplitter) token(advance int, line []byte) (int, []byte, error) {
	l.checked = 0
	return advance, line, nil
}

// Next returns the next event, io.EOF at a clean end of stream, or the
// transport's error.
func (r *sseReader) Next() (sseEvent, error) {
	var (
		data    strings.Builder
		hasData bool
		event   string
	)
	for r.sc.Scan() {
		line := r.sc.Bytes()
		if len(line) == 0 {
			if !hasData {
				event = ""
				continue
			}
			ev := sseEvent{ID: r.lastID, Event: event, Data: data.String()}
			if ev.Event == "" {
				ev.Event = "message"
			}
			return ev, nil
		}
		if line[0] == ':' {
			continue // comment, e.g. ": keepalive"
		}
		field, value, found := bytes.Cut(line, []byte(":"))
		if found {
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		switch string(field) {
		case "event":
			event = string(value)
		case "data":
			if hasData {
				data.WriteByte('\n')
			} else {
				data.Grow(len(value))
			}
			data.Write(value)
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				r.lastID = string(value)
			}
		}
		// "retry" and unknown fields are ignored.
	}
	if err := r.sc.Err(); err != nil {
		return sseEvent{}, err
	}
	return sseEvent{}, io.EOF
}
