package egress

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"slices"
)

// A WebSocket to a host holding a secret carries messages the host may
// fill with the value as it does a response (an echo, an error that
// quotes the request). Its frames from the host are scrubbed as a
// response body is: the data frames of one message as one stream (a value
// split across frames is found: the bytes that could begin one are held
// back to the message's next frame), control frames on their own. The
// proxy asks for no extension (no compression) and refuses frames that
// use one; frames go out unmasked and large ones in pieces of wsChunk, as
// RFC 6455 lets an intermediary re-fragment when no extension is in use.

// wsChunk is the largest payload read at once.
const wsChunk = 64 << 10

var errWSFrame = errors.New("websocket: a frame the proxy cannot scrub (an extension's bits, or a malformed control frame)")

// wsScrubReader reads the host's frames from r and yields them scrubbed,
// a piece of at most wsChunk at a time: what it holds is bounded whatever
// length a frame claims.
type wsScrubReader struct {
	sc    *scrubber
	r     *bufio.Reader
	out   []byte // scrubbed frames not yet read
	obuf  []byte // out's buffer, reused
	carry []byte // held-back data of the open message
	op    byte   // opcode of the message's next frame out (its own, then continuation)
	buf   []byte
	err   error

	// The data frame being read (left > 0, or a FIN frame not finished).
	inFrame bool
	fin     bool
	masked  bool
	key     [4]byte
	pos     uint64 // payload bytes read, for the mask
	left    uint64
}

func newWSScrubReader(sc *scrubber, r *bufio.Reader) *wsScrubReader {
	return &wsScrubReader{sc: sc, r: r}
}

func (w *wsScrubReader) Read(p []byte) (int, error) {
	for len(w.out) == 0 {
		if w.err != nil {
			return 0, w.err
		}
		w.out = w.obuf[:0] // its whole buffer again: the last was read
		if w.inFrame {
			w.err = w.piece()
		} else {
			w.err = w.frame()
		}
	}
	n := copy(p, w.out)
	w.out = w.out[n:]
	return n, nil
}

// read appends k payload bytes of the current frame to w.buf, unmasked.
func (w *wsScrubReader) read(k uint64) error {
	start := len(w.buf)
	w.buf = slices.Grow(w.buf, int(k))[:start+int(k)] // reused across pieces
	if _, err := io.ReadFull(w.r, w.buf[start:]); err != nil {
		return err
	}
	if w.masked {
		for i := range w.buf[start:] {
			w.buf[start+i] ^= w.key[(w.pos+uint64(i))%4]
		}
	}
	w.pos += k
	return nil
}

// frame reads a frame's header: a control frame whole, a data frame's
// first piece.
func (w *wsScrubReader) frame() error {
	var h [8]byte
	if _, err := io.ReadFull(w.r, h[:2]); err != nil {
		return err
	}
	fin, op := h[0]&0x80 != 0, h[0]&0x0f
	if h[0]&0x70 != 0 {
		return errWSFrame
	}
	w.masked = h[1]&0x80 != 0
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(w.r, h[:2]); err != nil {
			return err
		}
		n = uint64(binary.BigEndian.Uint16(h[:2]))
	case 127:
		if _, err := io.ReadFull(w.r, h[:8]); err != nil {
			return err
		}
		if n = binary.BigEndian.Uint64(h[:8]); n>>63 != 0 {
			return errWSFrame // the most significant bit must be 0
		}
	}
	if w.masked {
		if _, err := io.ReadFull(w.r, w.key[:]); err != nil {
			return err
		}
	}
	w.pos = 0
	if op >= 8 { // close, ping, pong: whole, at most 125 bytes
		if !fin || n > 125 {
			return errWSFrame
		}
		w.buf = w.buf[:0]
		if err := w.read(n); err != nil {
			return err
		}
		b := w.sc.replace(w.buf)
		if len(b) > 125 { // a placeholder longer than the value: keep a close's code only
			keep := 0
			if op == 8 {
				keep = 2
			}
			b = b[:keep]
		}
		w.out = appendWSFrame(w.out, true, op, b)
		w.obuf = w.out
		return nil
	}
	if op != 0 { // a new message
		w.op, w.carry = op, w.carry[:0]
	}
	w.inFrame, w.fin, w.left = true, fin, n
	return w.piece()
}

// piece reads the next piece (at most wsChunk) of the current data frame
// and appends what can go out.
func (w *wsScrubReader) piece() error {
	k := min(w.left, wsChunk)
	w.buf = append(w.buf[:0], w.carry...)
	if err := w.read(k); err != nil {
		return err
	}
	w.left -= k
	last := w.fin && w.left == 0
	b := w.buf
	cut := len(b)
	if !last {
		cut = w.sc.safeCut(b)
	}
	data := w.sc.replace(b[:cut])
	if len(data) > 0 || last {
		w.out = appendWSFrame(w.out, last, w.op, data)
		w.obuf = w.out
		w.op = 0 // the rest of the message is continuation
	}
	w.carry = append(w.carry[:0], b[cut:]...)
	if w.left == 0 {
		w.inFrame = false
	}
	return nil
}

// appendWSFrame appends an unmasked frame.
func appendWSFrame(out []byte, fin bool, op byte, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	switch n := len(payload); {
	case n < 126:
		out = append(out, b0, byte(n))
	case n <= 0xffff:
		out = append(out, b0, 126, byte(n>>8), byte(n))
	default:
		out = append(out, b0, 127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	return append(out, payload...)
}
