package agentproto

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// EventFramesType is the media type of the binary event stream: the same
// events as the NDJSON stream, with stdout/stderr data carried raw instead
// of base64 in JSON (encoding and decoding that JSON was most of the cost
// of streaming output). A client asks for it with Accept; an agent that
// does not know it answers NDJSON, so clients must look at Content-Type.
const EventFramesType = "application/x-space-events"

// HeaderPID carries the pid of a process started with follow=1 when the
// events are framed (the NDJSON stream carries it as its first line).
const HeaderPID = "X-Space-Pid"

// Frame kinds.
const (
	frameJSON   = 0 // the whole Event as JSON (start, exit, truncated)
	frameStdout = 1
	frameStderr = 2
)

// frameHeader: kind (1), seq (8), time in Unix nanoseconds (8), length (4).
const frameHeader = 21

// MaxFrame bounds one frame's payload (the agent reads output in 64 KiB
// chunks; JSON events are small).
const MaxFrame = 16 << 20

// WriteEventFrame appends ev to w as one frame.
func WriteEventFrame(w io.Writer, ev *Event) error {
	var hdr [frameHeader]byte
	payload := ev.Data
	switch ev.Type {
	case EventStdout:
		hdr[0] = frameStdout
	case EventStderr:
		hdr[0] = frameStderr
	default:
		hdr[0] = frameJSON
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		payload = b
	}
	binary.BigEndian.PutUint64(hdr[1:], ev.Seq)
	binary.BigEndian.PutUint64(hdr[9:], uint64(ev.Time.UnixNano()))
	binary.BigEndian.PutUint32(hdr[17:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// ReadEventFrame reads one frame into an Event. It returns io.EOF only at
// a frame boundary; a cut frame is io.ErrUnexpectedEOF.
func ReadEventFrame(r *bufio.Reader) (Event, error) {
	return ReadEventFrameInto(r, nil)
}

// ReadEventFrameInto is ReadEventFrame reading the payload into buf when
// it is large enough (a new buffer otherwise), so a reader that gets its
// buffers back can stream without an allocation per frame.
func ReadEventFrameInto(r *bufio.Reader, buf []byte) (Event, error) {
	return ReadEventFrameLimit(r, buf, MaxFrame)
}

// ErrFrameTooLarge is the error of a frame whose payload is over the
// reader's limit.
var ErrFrameTooLarge = errors.New("agentproto: event frame too large")

// frameGrowStep is how much of a frame's payload is allocated ahead of the
// data arriving: a header claiming a large payload costs memory only as
// the payload comes.
const frameGrowStep = 64 << 10

// ReadEventFrameLimit is ReadEventFrameInto refusing, with
// ErrFrameTooLarge, a payload over limit bytes (at most MaxFrame). The
// payload's memory grows with the data read, never to what the header
// claims before it arrives.
func ReadEventFrameLimit(r *bufio.Reader, buf []byte, limit int) (Event, error) {
	var ev Event
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return ev, err
	}
	n := int(binary.BigEndian.Uint32(hdr[17:]))
	if n > min(limit, MaxFrame) {
		return ev, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	payload, err := readPayload(r, buf, n)
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return ev, err
	}
	switch hdr[0] {
	case frameStdout, frameStderr:
		ev.Type = EventStdout
		if hdr[0] == frameStderr {
			ev.Type = EventStderr
		}
		ev.Seq = binary.BigEndian.Uint64(hdr[1:])
		ev.Time = time.Unix(0, int64(binary.BigEndian.Uint64(hdr[9:])))
		ev.Data = payload
	case frameJSON:
		if err := json.Unmarshal(payload, &ev); err != nil {
			return ev, fmt.Errorf("agentproto: event frame: %w", err)
		}
	default:
		return ev, fmt.Errorf("agentproto: unknown event frame kind %d", hdr[0])
	}
	return ev, nil
}

// readPayload reads n bytes into buf when it can hold them, else into a
// buffer grown as the data arrives. Its capacity goes back with the
// payload when recycled.
func readPayload(r io.Reader, buf []byte, n int) ([]byte, error) {
	if cap(buf) >= n {
		p := buf[:n]
		_, err := io.ReadFull(r, p)
		return p, err
	}
	p := buf[:0]
	for len(p) < n {
		if len(p) == cap(p) {
			p = slices.Grow(p, min(n-len(p), max(len(p), frameGrowStep)))
		}
		k, err := r.Read(p[len(p):min(cap(p), n)])
		p = p[:len(p)+k]
		if err != nil {
			if err == io.EOF && len(p) == n {
				break
			}
			return p, err
		}
	}
	return p, nil
}
