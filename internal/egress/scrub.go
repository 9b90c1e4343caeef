package egress

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// A host that is given a secret can send it back: a redirect that keeps
// the query string, an endpoint that echoes the request's headers, a
// "whoami" that returns the token. In an intercepted tunnel to such a host
// every response is scrubbed: each form of a secret's value the response
// could carry (as is, URL-escaped, formatted, inside any base64 text:
// scrub64.go) is replaced by the secret's placeholder, in header names and
// values and in the body, and the reason phrase is replaced by the
// standard one, before the sandbox reads it. What the proxy cannot read (a
// coding other than one gzip layer, a 206) is refused rather than passed
// on unread, and ranges are not asked for. Scrubbing alone would be a
// guessing oracle: guess.go says why requests are searched too.

// needle is one form of a secret's value the scrubber looks for.
type needle struct {
	core []byte // the bytes searched for
	repl []byte // what replaces them (raw forms; b64 forms rewrite their groups)
	b64  *b64form
	// before and after are how far a match's extent reaches around core
	// (the base64 groups it is verified and rewritten in): a stream holds
	// back what a match could still need.
	before, after int
	name          string // the secret's name
}

func (n *needle) extent() int { return n.before + len(n.core) + n.after }

// scrubber replaces the values of the secrets bound for one host.
type scrubber struct {
	needles []needle // longest first
	max     int      // longest extent
	escaped int      // longest value escaped (6 bytes a byte at most): what a guard keeps
}

// newScrubber returns the scrubber for the secrets bound to host (on any
// port: a host that was given a value on one port may show it on
// another), or nil when none is.
func newScrubber(secrets []*boundSecret, host string) *scrubber {
	var ns []needle
	esc := 0
	add := func(n needle) {
		if len(n.core) > 0 && !slices.ContainsFunc(ns, func(m needle) bool { return bytes.Equal(m.core, n.core) }) {
			ns = append(ns, n)
		}
	}
	for _, b := range secrets {
		if !b.matchName(host) {
			continue
		}
		v, name := string(b.secret.Value), b.secret.Name
		esc = max(esc, 6*len(v))
		raw := func(needle_, repl string) {
			add(needle{core: []byte(needle_), repl: []byte(repl), name: name})
		}
		// Every length counts: values shorter than MinSecretLen (stored
		// before it was required) are scrubbed too, however often they
		// occur by chance (fail closed: replace such a secret).
		raw(v, b.placeholder)
		raw(url.QueryEscape(v), b.placeholder)
		raw(url.PathEscape(v), b.placeholder)
		if f := b.secret.Inject.Format; f != "" {
			raw(strings.ReplaceAll(f, "{value}", v), strings.ReplaceAll(f, "{value}", b.placeholder))
		}
		if ba := b.secret.Inject.BasicAuth; ba != nil { // the credential as injected, exactly
			raw(base64.StdEncoding.EncodeToString([]byte(ba.User+":"+v)), base64.StdEncoding.EncodeToString([]byte(ba.User+":"+b.placeholder)))
		}
		// The value inside any base64 text, at any offset (scrub64.go).
		for _, n := range b64Needles(v, b.placeholder) {
			n.name = name
			add(n)
		}
	}
	if len(ns) == 0 {
		return nil
	}
	// Longest first, so a formatted value is replaced whole before the bare
	// value inside it.
	slices.SortStableFunc(ns, func(a, b needle) int { return len(b.core) - len(a.core) })
	sc := &scrubber{needles: ns, escaped: esc}
	for i := range ns {
		sc.max = max(sc.max, ns[i].extent())
	}
	return sc
}

// prepare asks the upstream for a body the scrubber can read, for
// WebSocket messages it can read (no compression extension), and for
// whole representations: a range of a body that reflects the value is a
// piece the scrubber cannot recognise (6 bytes at a time rebuilt it), so
// Range and If-Range are removed.
func (sc *scrubber) prepare(req *http.Request) {
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Del("Sec-WebSocket-Extensions")
	req.Header.Del("Range")
	req.Header.Del("If-Range")
}

// errEncoded refuses a response body in an encoding the scrubber cannot
// read; errPartial one that is a piece of a body (206) although no range
// was asked for.
var (
	errEncoded = errors.New("response body in an encoding the proxy cannot inspect")
	errPartial = errors.New("partial response the proxy cannot inspect")
)

// response scrubs resp's status line and header names and values, and
// wraps its body. A body in an encoding other than gzip (or named by more
// than one Content-Encoding line, or in more than one layer) is
// errEncoded; a 206 is errPartial.
func (sc *scrubber) response(req *http.Request, resp *http.Response) error {
	// The reason phrase is the upstream's free text: the standard one
	// replaces it (clients ignore it), so nothing the host wrote there
	// reaches the sandbox, in whatever form.
	resp.Status = ""
	sc.scrubHeader(resp.Header)
	if resp.StatusCode == http.StatusPartialContent {
		return errPartial
	}
	if resp.StatusCode < 200 || resp.Body == nil || resp.Body == http.NoBody || req.Method == http.MethodHead ||
		resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
		return nil
	}
	body := io.Reader(resp.Body)
	// One Content-Encoding line with one coding, or none: reading only
	// the first of several lines passed "identity" then "gzip" unread, so
	// anything else (more lines, layers, codings not read here) is refused.
	ce := resp.Header.Values("Content-Encoding")
	if len(ce) > 1 || len(ce) == 1 && strings.Contains(ce[0], ",") {
		return errEncoded
	}
	if len(ce) == 1 {
		switch strings.ToLower(strings.TrimSpace(ce[0])) {
		case "", "identity":
		case "gzip", "x-gzip":
			zr, err := gzip.NewReader(resp.Body)
			if err != nil {
				return errEncoded
			}
			body = zr
		default:
			return errEncoded
		}
	}
	resp.Header.Del("Content-Encoding")
	// The length can change: the body goes chunked (or until close).
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	if req.ProtoAtLeast(1, 1) {
		resp.TransferEncoding = []string{"chunked"}
	} else {
		resp.TransferEncoding = nil
		resp.Close = true
	}
	resp.Body = &scrubReader{sc: sc, r: body, c: resp.Body, trailer: resp.Trailer}
	return nil
}

// scrubHeader replaces the needles in h's values and names (a host can
// send the value back as a header's name as well).
func (sc *scrubber) scrubHeader(h http.Header) {
	for k, vs := range h {
		for i, v := range vs {
			vs[i] = string(sc.replace([]byte(v)))
		}
		if nk := sc.replaceFold(k); nk != k {
			delete(h, k)
			h[http.CanonicalHeaderKey(nk)] = append(h[http.CanonicalHeaderKey(nk)], vs...)
		}
	}
}

// replaceFold is replace ignoring ASCII case, for header names (HTTP
// canonicalizes them: a value sent back as a name arrives with its letters'
// case changed). Base64 forms cannot be verified once their case changed:
// their cores of 8 characters or more are replaced.
func (sc *scrubber) replaceFold(k string) string {
	for i := range sc.needles {
		n := &sc.needles[i]
		repl := n.repl
		if n.b64 != nil {
			if len(n.core) < 8 {
				continue
			}
			repl = n.b64.fall
		}
		ln := strings.ToLower(string(n.core))
		for from := 0; ; {
			j := strings.Index(strings.ToLower(k[from:]), ln)
			if j < 0 {
				break
			}
			j += from
			k = k[:j] + string(repl) + k[j+len(n.core):]
			from = j + len(repl) // past it: a placeholder may hold the value
		}
	}
	return k
}

// replace returns b with every needle replaced.
func (sc *scrubber) replace(b []byte) []byte {
	for i := range sc.needles {
		n := &sc.needles[i]
		if !bytes.Contains(b, n.core) {
			continue
		}
		if n.b64 == nil {
			b = bytes.ReplaceAll(b, n.core, n.repl)
			continue
		}
		b = n.replace64(b)
	}
	return b
}

// replace64 rewrites every verified base64 match of n in b (and replaces
// an unverified core of 8 or more characters on its own).
func (n *needle) replace64(b []byte) []byte {
	var out []byte
	done := 0 // b[:done] is in out
	for from := 0; from < len(b); {
		j := bytes.Index(b[from:], n.core)
		if j < 0 {
			break
		}
		i := from + j
		if start, end, rw, ok := n.b64.verify(b, i); ok && start >= done {
			out = append(append(out, b[done:start]...), rw...)
			done, from = end, end
			continue
		}
		if len(n.core) >= 8 {
			out = append(append(out, b[done:i]...), n.b64.fall...)
			done = i + len(n.core)
			from = done
			continue
		}
		from = i + 1
	}
	if out == nil {
		return b
	}
	return append(out, b[done:]...)
}

// find returns the needle b holds (a raw form, a verified base64 form or
// an unverified base64 core of 8 or more characters), or nil.
func (sc *scrubber) find(b []byte) *needle {
	for i := range sc.needles {
		n := &sc.needles[i]
		for from := 0; from < len(b); {
			j := bytes.Index(b[from:], n.core)
			if j < 0 {
				break
			}
			if n.b64 == nil || len(n.core) >= 8 {
				return n
			}
			if _, _, _, ok := n.b64.verify(b, from+j); ok {
				return n
			}
			from += j + 1
		}
	}
	return nil
}

// safeCut is how much of buf can be scrubbed and passed on when more may
// follow: all but a tail that could be the start of a match's extent; a
// match whose extent crosses the cut is left whole in the tail (moving
// the cut back can make another cross it: until none does).
func (sc *scrubber) safeCut(buf []byte) int {
	cut := len(buf) - min(len(buf), sc.max-1)
	for moved := true; moved; {
		moved = false
		for k := range sc.needles {
			n := &sc.needles[k]
			from := max(0, cut-len(n.core)-n.after+1)
			for {
				i := bytes.Index(buf[from:], n.core)
				if i < 0 || from+i >= cut+n.before {
					break
				}
				i += from
				if s, e := max(0, i-n.before), i+len(n.core)+n.after; s < cut && e > cut {
					cut, moved = s, true
					break
				}
				from = i + 1
			}
		}
	}
	return cut
}

// scrubReader is a body with the needles replaced as it streams: it keeps
// back the last max-1 bytes of what it read (they may begin a needle the
// next read completes). Its buffers are reused: a body with no needle costs
// a scan and a copy per read, no allocation.
type scrubReader struct {
	sc   *scrubber
	r    io.Reader
	c    io.Closer
	buf  []byte // buf[:n] read, not yet scrubbed
	n    int
	obuf []byte // scrubbed, out[...] not yet returned
	out  []byte
	eof  bool
	rerr error
	// trailer is the response's (values filled in when its body ends):
	// scrubbed in place at the end, before the response's writer sends it.
	trailer http.Header
}

func (s *scrubReader) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.eof {
			return 0, s.rerr
		}
		if s.buf == nil {
			s.buf = make([]byte, max(64<<10, 4*s.sc.max))
		}
		m, err := s.r.Read(s.buf[s.n:])
		s.n += m
		cut := s.n
		if err != nil {
			s.eof, s.rerr = true, err
			s.sc.scrubHeader(s.trailer)
		} else {
			// Pass on all but a tail that could be the start of a needle;
			// a needle crossing the cut is left whole in the tail (moving
			// the cut back can make another cross it: until none does).
			cut = s.sc.safeCut(s.buf[:s.n])
		}
		s.obuf = append(s.obuf[:0], s.sc.replace(s.buf[:cut])...)
		s.out = s.obuf
		s.n = copy(s.buf, s.buf[cut:s.n])
		if s.n == len(s.buf) {
			s.buf = append(s.buf, make([]byte, len(s.buf))...) // a tail that fills it: room to read on
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *scrubReader) Close() error { return s.c.Close() }
