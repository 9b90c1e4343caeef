package egress

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Guessing. A host that reflects what it is sent (an echo, an error that
// quotes the request) turns scrubbing into an oracle: the sandbox sends a
// word list, and the one word the proxy rewrites to the placeholder is
// the value. Scrubbing cannot tell the host's copy of the value (which it
// must hide) from the sandbox's copy (a correct guess) by content, and
// blocking a response that holds the value is the same oracle (502 for
// the right guess, 200 for a wrong one).
//
// So the proxy looks at what the sandbox sends instead. A sandbox never
// holds a secret's value (only its placeholder), so a request of its own
// that carries the value, in any form the scrubber knows, is a guess (or
// the value leaked some other way: either way the secret is compromised
// for that sandbox). Before injection, the target, every header name and
// value, the request body and the client's WebSocket messages to a host
// the scrubber covers are searched, as sent and with the escapes hosts
// commonly decode undone (%XX, \uXXXX, \xXX, &#NN;); a match refuses the request (403
// secret_value, audited) and revokes the secret for the sandbox: from then
// on every request to that secret's hosts is refused (secret_revoked),
// so no response the scrubber rewrote, or any other, can answer a further
// guess. The sandbox learns one bit once ("some request held the value")
// and nothing more. A guess the host must first transform in another way
// (reverse, decompress, decrypt) is outside what the proxy can see; the host's own
// check (a guessed value sent as the credential, one per request, seen by
// the host) remains, as it would without the proxy.

// errGuess ends a request whose body carries a secret's value.
var errGuess = errors.New("the request carries a secret's value")

// guessIn returns the name of the secret whose value req's target or
// header carries ("" when none). Called before injection.
func (sc *scrubber) guessIn(req *http.Request) string {
	texts := []string{req.URL.RequestURI()}
	if u, err := url.PathUnescape(req.URL.RequestURI()); err == nil {
		texts = append(texts, u)
	}
	if u, err := url.QueryUnescape(req.URL.RawQuery); err == nil {
		texts = append(texts, u)
	}
	for k, vs := range req.Header {
		// Names arrive canonicalized (their case changed), and the
		// scrubber rewrites them ignoring case: searched the same way.
		if i := sc.foldIndex(k); i >= 0 {
			return sc.needles[i].name
		}
		texts = append(texts, vs...)
	}
	for _, t := range texts {
		if n := sc.findAny([]byte(t)); n != nil {
			return n.name
		}
	}
	return ""
}

// findAny is find in b and in b with its escapes decoded (unescapeView):
// a host that decodes what it is sent (a form, JSON) and reflects the
// result would hand the scrubber a guess sent escaped.
func (sc *scrubber) findAny(b []byte) *needle {
	return sc.findIn(b, nil)
}

// findIn is findAny with a reusable buffer for the decoded view (nil:
// allocated).
func (sc *scrubber) findIn(b []byte, view *[]byte) *needle {
	if n := sc.find(b); n != nil {
		return n
	}
	var dst []byte
	if view != nil {
		dst = *view
	}
	u, ok := unescapeView(dst, b)
	if !ok {
		return nil
	}
	if view != nil {
		*view = u
	}
	return sc.find(u)
}

// foldIndex returns the index of a needle k holds ignoring ASCII case (the
// forms replaceFold rewrites), or -1.
func (sc *scrubber) foldIndex(k string) int {
	lk := strings.ToLower(k)
	for i := range sc.needles {
		n := &sc.needles[i]
		if n.b64 != nil && len(n.core) < 8 {
			continue
		}
		if strings.Contains(lk, strings.ToLower(string(n.core))) {
			return i
		}
	}
	return -1
}

// guardReader passes a request body (or a client's WebSocket payloads)
// on and fails with errGuess at the first read that completes a secret's
// value; found names the secret. It keeps the last bytes it read so a
// value split across reads is seen.
type guardReader struct {
	sc    *scrubber
	r     io.Reader
	win   []byte
	view  []byte // the window with its escapes decoded (reused)
	found string
}

func (g *guardReader) Read(p []byte) (int, error) {
	if g.found != "" {
		return 0, errGuess
	}
	n, err := g.r.Read(p)
	if _, gerr := g.check(p[:n]); gerr != nil {
		return 0, gerr
	}
	return n, err
}

// check adds b to the window and searches it (errGuess on a match).
func (g *guardReader) check(b []byte) (int, error) {
	if g.found != "" {
		return 0, errGuess
	}
	g.win = append(g.win, b...)
	if nd := g.sc.findIn(g.win, &g.view); nd != nil {
		g.found = nd.name
		return 0, errGuess
	}
	if keep := max(g.sc.max, g.sc.escaped) - 1; len(g.win) > keep {
		g.win = append(g.win[:0], g.win[len(g.win)-keep:]...)
	}
	return len(b), nil
}

func (g *guardReader) Close() error {
	if c, ok := g.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// revoke marks a secret revoked for a sandbox (until RemoveSandbox; a new
// binding does not undo it) and closes the sandbox's open connections to
// the secret's hosts but self (which the caller ends after answering): a
// WebSocket already open there would go on echoing (and scrubbing)
// guesses. Both happen before the caller answers, so no request or frame
// the sandbox sends once it has the answer gets through.
func (p *Proxy) revoke(sandboxID, name string, self *tracked) {
	p.mu.Lock()
	if p.revoked[sandboxID] == nil {
		p.revoked[sandboxID] = map[string]bool{}
	}
	p.revoked[sandboxID][name] = true
	var cut []*tracked
	if st := p.sbs[sandboxID]; st != nil {
		for _, t := range p.conns[sandboxID] {
			d := t.dest.Load()
			if t != self && d != nil && slices.ContainsFunc(st.secrets, func(b *boundSecret) bool { return b.secret.Name == name && b.matchName(d.host) }) {
				cut = append(cut, t)
			}
		}
	}
	p.mu.Unlock()
	for _, t := range cut {
		t.cancel()
	}
}

// revokedFor returns the name of a secret revoked for the sandbox whose
// hosts include host ("" when none).
func (p *Proxy) revokedFor(sandboxID string, st *sandboxState, host string) string {
	p.mu.RLock()
	rv := p.revoked[sandboxID]
	p.mu.RUnlock()
	for _, b := range st.secrets {
		if rv[b.secret.Name] && b.matchName(host) {
			return b.secret.Name
		}
	}
	return ""
}

// unescapeView decodes, leniently, the escapes a host commonly decodes
// before it reflects text: %XX (forms, URLs), \\uXXXX and \\xXX (JSON,
// JavaScript), &#NN; and &#xHH; (HTML), into dst's buffer. ok is false
// when b holds none that decodes (the view would be b itself).
func unescapeView(dst, b []byte) ([]byte, bool) {
	first := -1
	for _, c := range []byte{'%', '\\', '&'} {
		for from := 0; from < len(b); {
			i := bytes.IndexByte(b[from:], c)
			if i < 0 {
				break
			}
			i += from
			if _, n := unescapeAt(b, i); n > 0 {
				if first < 0 || i < first {
					first = i
				}
				break
			}
			from = i + 1
		}
	}
	if first < 0 {
		return nil, false
	}
	out := append(dst[:0], b[:first]...)
	for i := first; i < len(b); i++ {
		if b[i] == '%' || b[i] == '\\' || b[i] == '&' {
			if r, n := unescapeAt(b, i); n > 0 {
				if r < 0x80 {
					out = append(out, byte(r))
				} else {
					out = utf8.AppendRune(out, r)
				}
				i += n - 1
				continue
			}
		}
		out = append(out, b[i])
	}
	return out, true
}

// unescapeAt decodes the escape at b[i:], returning the character and the
// escape's length (0: none there).
func unescapeAt(b []byte, i int) (rune, int) {
	hexv := func(s []byte) (rune, bool) {
		var r rune
		for _, c := range s {
			switch {
			case c >= '0' && c <= '9':
				r = r<<4 | rune(c-'0')
			case c >= 'a' && c <= 'f':
				r = r<<4 | rune(c-'a'+10)
			case c >= 'A' && c <= 'F':
				r = r<<4 | rune(c-'A'+10)
			default:
				return 0, false
			}
		}
		return r, len(s) > 0
	}
	switch c := b[i]; {
	case c == '%' && i+2 < len(b):
		if r, ok := hexv(b[i+1 : i+3]); ok {
			return r, 3
		}
	case c == '\\' && i+5 < len(b) && b[i+1] == 'u':
		if r, ok := hexv(b[i+2 : i+6]); ok {
			return r, 6
		}
	case c == '\\' && i+3 < len(b) && b[i+1] == 'x':
		if r, ok := hexv(b[i+2 : i+4]); ok {
			return r, 4
		}
	case c == '&' && i+3 < len(b) && b[i+1] == '#':
		if j := bytes.IndexByte(b[i+2:min(len(b), i+12)], ';'); j > 0 {
			num := b[i+2 : i+2+j]
			if num[0] == 'x' || num[0] == 'X' {
				if r, ok := hexv(num[1:]); ok && r <= 0x10ffff {
					return r, 3 + j
				}
			} else if n, err := strconv.Atoi(string(num)); err == nil && n >= 0 && n <= 0x10ffff {
				return rune(n), 3 + j
			}
		}
	}
	return 0, 0
}
