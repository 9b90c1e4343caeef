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
// could carry (as is, URL-escaped, inside the basic-auth credential) is
// replaced by the secret's placeholder, in header values and in the body,
// before the sandbox reads it. A body the proxy cannot read (an encoding
// other than gzip) is refused rather than passed on unread.

// scrubber replaces the values of the secrets bound for one host.
type scrubber struct {
	needles [][]byte // longest first
	repl    [][]byte
	max     int // longest needle
}

// newScrubber returns the scrubber for the secrets bound to host, or nil
// when none is.
func newScrubber(secrets []*boundSecret, host string) *scrubber {
	type pair struct{ needle, repl string }
	var pairs []pair
	add := func(needle, ph string) {
		// A value that short is not a secret worth matching.
		if len(needle) >= 4 && !slices.ContainsFunc(pairs, func(p pair) bool { return p.needle == needle }) {
			pairs = append(pairs, pair{needle, ph})
		}
	}
	for _, b := range secrets {
		if !b.matchHost(host) {
			continue
		}
		v := string(b.secret.Value)
		add(v, b.placeholder)
		add(url.QueryEscape(v), b.placeholder)
		add(url.PathEscape(v), b.placeholder)
		if ba := b.secret.Inject.BasicAuth; ba != nil {
			add(base64.StdEncoding.EncodeToString([]byte(ba.User+":"+v)), base64.StdEncoding.EncodeToString([]byte(ba.User+":"+b.placeholder)))
		}
		// The value inside any base64 text, at each of the three byte
		// alignments it can start at: a basic-auth credential whose user
		// (and text around the placeholder) the sandbox chose, echoed back,
		// carried it where the forms above did not match.
		// At least 8 characters (6 bytes of the value), so that random
		// base64 (an image in a JSON body) does not match by chance.
		vs, ps := base64Inner(v), base64Inner(b.placeholder)
		for i := range vs {
			if len(vs[i]) >= 8 {
				add(vs[i], ps[i])
			}
		}
		if f := b.secret.Inject.Format; f != "" {
			add(strings.ReplaceAll(f, "{value}", v), strings.ReplaceAll(f, "{value}", b.placeholder))
		}
	}
	if len(pairs) == 0 {
		return nil
	}
	// Longest first, so a formatted value is replaced whole before the bare
	// value inside it.
	slices.SortStableFunc(pairs, func(a, b pair) int { return len(b.needle) - len(a.needle) })
	sc := &scrubber{}
	for _, p := range pairs {
		sc.needles = append(sc.needles, []byte(p.needle))
		sc.repl = append(sc.repl, []byte(p.repl))
		sc.max = max(sc.max, len(p.needle))
	}
	return sc
}

// base64Inner returns, for each alignment o (0, 1, 2: the number of bytes
// before v in its 3-byte group), the part of any standard base64 text
// holding v at that alignment that v's bytes alone decide: the whole
// 4-character groups v fills, without the first (shared with what
// precedes it) and the last (shared with what follows). Empty where v is
// too short to fill one.
func base64Inner(v string) [3]string {
	var out [3]string
	for o := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, o), v...))
		start := 0
		if o > 0 {
			start = 4
		}
		if end := (o + len(v)) / 3 * 4; end > start {
			out[o] = enc[start:end]
		}
	}
	return out
}

// prepare asks the upstream for a body the scrubber can read, and for
// WebSocket messages it can read (no compression extension).
func (sc *scrubber) prepare(req *http.Request) {
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Del("Sec-WebSocket-Extensions")
}

// errEncoded refuses a response body in an encoding the scrubber cannot
// read.
var errEncoded = errors.New("response body in an encoding the proxy cannot inspect")

// response scrubs resp's header values and wraps its body. A body in an
// encoding other than gzip is errEncoded.
func (sc *scrubber) response(req *http.Request, resp *http.Response) error {
	sc.scrubHeader(resp.Header)
	if resp.StatusCode < 200 || resp.Body == nil || resp.Body == http.NoBody || req.Method == http.MethodHead ||
		resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
		return nil
	}
	body := io.Reader(resp.Body)
	switch enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return errEncoded
		}
		body = zr
		resp.Header.Del("Content-Encoding")
	default:
		return errEncoded
	}
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
// case changed).
func (sc *scrubber) replaceFold(k string) string {
	for i, n := range sc.needles {
		ln := strings.ToLower(string(n))
		for from := 0; ; {
			j := strings.Index(strings.ToLower(k[from:]), ln)
			if j < 0 {
				break
			}
			j += from
			k = k[:j] + string(sc.repl[i]) + k[j+len(n):]
			from = j + len(sc.repl[i]) // past it: a placeholder may hold the value
		}
	}
	return k
}

// replace returns b with every needle replaced.
func (sc *scrubber) replace(b []byte) []byte {
	for i, n := range sc.needles {
		if bytes.Contains(b, n) {
			b = bytes.ReplaceAll(b, n, sc.repl[i])
		}
	}
	return b
}

// safeCut is how much of buf can be scrubbed and passed on when more may
// follow: all but a tail that could be the start of a needle; a needle
// crossing the cut is left whole in the tail (moving the cut back can make
// another cross it: until none does).
func (sc *scrubber) safeCut(buf []byte) int {
	cut := len(buf) - min(len(buf), sc.max-1)
	for moved := true; moved; {
		moved = false
		for _, nd := range sc.needles {
			from := max(0, cut-len(nd)+1)
			if i := bytes.Index(buf[from:], nd); i >= 0 && from+i < cut && from+i+len(nd) > cut {
				cut, moved = from+i, true
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
