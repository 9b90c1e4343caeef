package egress

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
)

// After a 101 the proxy no longer reads HTTP: the connection belongs to
// the one upstream connection it was upgraded on (never dialed again, so
// its host cannot change), and what the client sends on it must be
// WebSocket frames. Only WebSocket upgrades are let through (an "Upgrade:
// h2c" is removed from requests: HTTP/2 on an upgraded connection could
// name another host in each stream, as a second HTTP/1.1 request could).
// The client's frames are read as they pass: each must be masked (RFC
// 6455: every client frame is), use no reserved bit (but RSV1 when an
// extension was agreed) and a known opcode, and control frames must be
// whole and short. Text that is not WebSocket, such as an HTTP request
// line, fails the first check (its second byte, a letter, has no mask
// bit) and ends the connection. Toward a host holding a secret the
// unmasked payloads are also searched for the secret's value (guess.go).

var errWSClientFrame = errors.New("websocket: the client sent something that is not a client frame")

// wsClientReader passes a client's frames through, validating each header.
type wsClientReader struct {
	r   *bufio.Reader
	ext bool        // an extension was agreed: RSV1 may be set
	sc  *scrubber   // when set, payloads are searched for a secret's value
	g   guardReader // the search's state (its r is unused)
	// onGuess runs when a payload carried a secret's value, before the
	// connection ends (so the revocation is in force once the sandbox
	// sees it end).
	onGuess func(name string)

	hdr   []byte // a validated header not yet returned
	plain []byte // the payload just read, unmasked (reused)
	left  uint64 // payload bytes of the current frame not yet read
	key   [4]byte
	pos   uint64
	err   error
}

func newWSClientReader(r *bufio.Reader, ext bool, sc *scrubber) *wsClientReader {
	w := &wsClientReader{r: r, ext: ext, sc: sc}
	w.g.sc = sc
	return w
}

// guessed names the secret whose value the client's payloads carried.
func (w *wsClientReader) guessed() string { return w.g.found }

func (w *wsClientReader) Read(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if len(w.hdr) > 0 {
		n := copy(p, w.hdr)
		w.hdr = w.hdr[n:]
		return n, nil
	}
	if w.left == 0 {
		if w.err = w.header(); w.err != nil {
			return 0, w.err
		}
		if len(w.hdr) > 0 {
			n := copy(p, w.hdr)
			w.hdr = w.hdr[n:]
			return n, nil
		}
	}
	n, err := w.r.Read(p[:min(uint64(len(p)), w.left)])
	if n > 0 && w.sc != nil {
		w.plain = append(w.plain[:0], p[:n]...)
		plain := w.plain
		for i := range n {
			plain[i] ^= w.key[(w.pos+uint64(i))%4]
		}
		if _, gerr := w.g.check(plain); gerr != nil {
			if w.onGuess != nil {
				w.onGuess(w.g.found)
			}
			w.err = gerr
			return 0, gerr
		}
	}
	w.pos += uint64(n)
	w.left -= uint64(n)
	if err == io.EOF && w.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	w.err = err
	return n, err
}

// header reads and validates the next frame header into w.hdr.
func (w *wsClientReader) header() error {
	var h [14]byte
	if _, err := io.ReadFull(w.r, h[:2]); err != nil {
		return err
	}
	rsv := h[0] & 0x70
	if w.ext {
		rsv &^= 0x40
	}
	op := h[0] & 0x0f
	if rsv != 0 || op > 2 && op < 8 || op > 10 || h[1]&0x80 == 0 {
		return errWSClientFrame
	}
	n, k := uint64(h[1]&0x7f), 2
	switch n {
	case 126:
		if _, err := io.ReadFull(w.r, h[2:4]); err != nil {
			return err
		}
		n, k = uint64(binary.BigEndian.Uint16(h[2:4])), 4
	case 127:
		if _, err := io.ReadFull(w.r, h[2:10]); err != nil {
			return err
		}
		if n, k = binary.BigEndian.Uint64(h[2:10]), 10; n>>63 != 0 {
			return errWSClientFrame
		}
	}
	if op >= 8 && (h[0]&0x80 == 0 || n > 125) {
		return errWSClientFrame
	}
	if _, err := io.ReadFull(w.r, h[k:k+4]); err != nil {
		return err
	}
	copy(w.key[:], h[k:k+4])
	w.hdr = append(w.hdr[:0], h[:k+4]...)
	w.left, w.pos = n, 0
	return nil
}
