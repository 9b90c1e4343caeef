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
	sc.Split(scanSSELines)
	return &sseReader{sc: sc}
}

// scanSSELines splits on CRLF, LF or a lone CR.
func scanSSELines(data []byte, atEOF bool) (int, []byte, error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		if data[i] == '\n' {
			return i + 1, data[:i], nil
		}
		// CR: swallow a following LF, which may not have arrived yet.
		if i+1 < len(data) {
			if data[i+1] == '\n' {
				return i + 2, data[:i], nil
			}
			return i + 1, data[:i], nil
		}
		if atEOF {
			return i + 1, data[:i], nil
		}
		return 0, nil, nil
	}
	if atEOF {
		// A final line without terminator never completes an event, but hand
		// it over so the caller sees a consistent stream.
		return len(data), data, nil
	}
	return 0, nil, nil
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
		line := r.sc.Text()
		if line == "" {
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
		field, value, found := strings.Cut(line, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		switch field {
		case "event":
			event = value
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.WriteString(value)
			hasData = true
		case "id":
			if !strings.ContainsRune(value, 0) {
				r.lastID = value
			}
		}
		// "retry" and unknown fields are ignored.
	}
	if err := r.sc.Err(); err != nil {
		return sseEvent{}, err
	}
	return sseEvent{}, io.EOF
}
