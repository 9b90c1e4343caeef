package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var errHeadTooLarge = errors.New("request header too large")

// peekHead returns the request head (through the blank line) without
// consuming it, so the raw Host header can be read before
// http.ReadRequest drops it for absolute-form requests.
func peekHead(br *bufio.Reader) ([]byte, error) {
	n := 1
	from := 0 // scanned before: a head dripped a byte at a time cost O(n²)
	for {
		b, err := br.Peek(n)
		if err == nil {
			b, _ = br.Peek(br.Buffered())
		}
		if i := headEnd(b[from:]); i >= 0 {
			return b[:from+i], nil
		}
		// The end ("\n\n" or "\n\r\n") may start in the last two bytes.
		from = max(0, len(b)-2)
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errHeadTooLarge
		}
		if err != nil {
			return nil, err
		}
		n = br.Buffered() + 1
		if n > br.Size() {
			return nil, errHeadTooLarge
		}
	}
}

func headEnd(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if i+1 < len(b) && b[i+1] == '\n' {
			return i + 2
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			return i + 3
		}
	}
	return -1
}

// headerValue returns the first value of a header in a raw head.
func headerValue(head []byte, name string) string {
	lines := bytes.Split(head, []byte("\n"))
	for _, l := range lines[1:] {
		k, v, ok := bytes.Cut(l, []byte(":"))
		if ok && strings.EqualFold(string(bytes.TrimSpace(k)), name) {
			return string(bytes.TrimSpace(v))
		}
	}
	return ""
}

// hostMatches reports whether a Host header names host (and port, if it
// names one).
func hostMatches(hdr, host string, port int) bool {
	if hdr == "" {
		return false
	}
	h, p := hdr, ""
	if hh, pp, err := net.SplitHostPort(hdr); err == nil {
		h, p = hh, pp
	}
	if normalizeHost(h) != host {
		return false
	}
	return p == "" || p == strconv.Itoa(port)
}

// countConn counts bytes to (up) and from (down) an upstream.
type countConn struct {
	net.Conn
	up, down atomic.Int64
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.down.Add(int64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.up.Add(int64(n))
	return n, err
}

type closeWriter interface{ CloseWrite() error }

func (c *countConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// bufConn reads through a bufio.Reader that may hold bytes already peeked.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// pipe copies both ways until both directions end, half-closing where the
// connection allows and closing both where it does not. A direction that
// ends in an error (a reset, a closed connection: not a clean EOF) ends
// both: half-closed, a silent other side held its socket and goroutine
// for good.
func pipe(a net.Conn, ar io.Reader, b net.Conn, br io.Reader) {
	var wg sync.WaitGroup
	cp := func(dst net.Conn, src io.Reader) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if cw, ok := dst.(closeWriter); err != nil || !ok || cw.CloseWrite() != nil {
			a.Close()
			b.Close()
		}
	}
	wg.Add(2)
	go cp(b, ar)
	go cp(a, br)
	wg.Wait()
}

const (
	kindEnd = iota
	kindTLS
	kindHTTP
	kindRaw
)

// sniff classifies a tunnel by its first bytes. Anything that could be an
// HTTP request line (letters then a space, or leading whitespace) is
// treated as HTTP, so a nested CONNECT cannot hide as "raw".
//
// Ports 80 and 443 wait for the client (IdleTimeout). Other ports decide
// by who speaks first: the client is given SniffTimeout alone, then the
// client and the upstream race and an upstream that speaks first
// (ssh, smtp: server-speaks-first) makes the tunnel raw. A slow client's
// TLS is never relayed raw for being slow: a sandbox holding secrets has
// every TLS tunnel intercepted, however long its ClientHello takes.
//
// The returned reader is the upstream's, holding whatever it sent while
// the race was on; every later read of the upstream goes through it.
func (s *session) sniff(port int, up net.Conn) (int, *bufio.Reader) {
	upr := bufio.NewReaderSize(up, 32<<10)
	if port == 80 || port == 443 {
		_ = s.c.SetReadDeadline(time.Now().Add(s.p.cfg.IdleTimeout))
		defer s.c.SetReadDeadline(time.Time{})
		if _, err := s.br.Peek(1); err != nil {
			return kindEnd, upr
		}
		return s.classify(), upr
	}
	_ = s.c.SetReadDeadline(time.Now().Add(s.p.cfg.SniffTimeout))
	_, err := s.br.Peek(1)
	_ = s.c.SetReadDeadline(time.Time{})
	if err == nil {
		return s.classify(), upr
	}
	if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
		return kindEnd, upr
	}
	// The race. The upstream's first byte interrupts the client's wait.
	_ = s.c.SetReadDeadline(time.Now().Add(s.p.cfg.IdleTimeout))
	var upFirst atomic.Bool
	upDone := make(chan struct{})
	go func() {
		defer close(upDone)
		if _, err := upr.Peek(1); err == nil {
			upFirst.Store(true)
			_ = s.c.SetReadDeadline(time.Unix(1, 0))
		}
	}()
	_, err = s.br.Peek(1)
	_ = up.SetReadDeadline(time.Unix(1, 0)) // end the upstream's wait, if still on
	<-upDone
	_ = up.SetReadDeadline(time.Time{})
	_ = s.c.SetReadDeadline(time.Time{})
	switch {
	case err == nil:
		return s.classify(), upr
	case upFirst.Load():
		return kindRaw, upr
	}
	return kindEnd, upr
}

// classify looks at the client's first bytes (at least one is buffered).
func (s *session) classify() int {
	b, _ := s.br.Peek(1)
	_ = s.c.SetReadDeadline(time.Now().Add(s.p.cfg.IdleTimeout))
	defer s.c.SetReadDeadline(time.Time{})
	isLetter := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	switch c := b[0]; {
	case c == 0x16:
		return kindTLS
	case c == ' ' || c == '\t' || c == '\r' || c == '\n':
		return kindHTTP
	case isLetter(c):
		for n := 2; n <= 32; n++ {
			b, err := s.br.Peek(n)
			if err != nil {
				return kindHTTP
			}
			if b[n-1] == ' ' {
				return kindHTTP
			}
			if !isLetter(b[n-1]) {
				return kindRaw
			}
		}
		return kindHTTP
	}
	return kindRaw
}

var errSniffed = errors.New("sniffed")

// peekClientHello parses the ClientHello at the head of br without
// consuming it (crypto/tls parses; the handshake is abandoned at once).
func peekClientHello(br *bufio.Reader) (*tls.ClientHelloInfo, error) {
	hdr, err := br.Peek(5)
	if err != nil {
		return nil, err
	}
	if hdr[0] != 0x16 {
		return nil, errors.New("not a TLS handshake")
	}
	rec, err := br.Peek(5 + int(binary.BigEndian.Uint16(hdr[3:5])))
	if err != nil {
		return nil, err
	}
	var hello *tls.ClientHelloInfo
	_ = tls.Server(&readOnlyConn{r: bytes.NewReader(rec)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello = h
			return nil, errSniffed
		},
	}).Handshake()
	if hello == nil {
		return nil, errors.New("malformed ClientHello")
	}
	return hello, nil
}

type readOnlyConn struct {
	net.Conn
	r io.Reader
}

func (c *readOnlyConn) Read(p []byte) (int, error)         { return c.r.Read(p) }
func (c *readOnlyConn) Write(p []byte) (int, error)        { return 0, io.ErrClosedPipe }
func (c *readOnlyConn) Close() error                       { return nil }
func (c *readOnlyConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (c *readOnlyConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (c *readOnlyConn) SetDeadline(t time.Time) error      { return nil }
func (c *readOnlyConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *readOnlyConn) SetWriteDeadline(t time.Time) error { return nil }

// intercept terminates the sandbox's TLS with its CA, opens verified TLS to
// the vetted upstream, and relays HTTP/1.1 with secrets injected.
func (s *session) intercept(ctx context.Context, rec *Record, up *countConn, upr *bufio.Reader) {
	ca, err := s.p.cfg.CAs.Get(s.sb)
	if err != nil {
		s.log.Error("egress CA", "err", err)
		rec.Decision, rec.Reason, rec.Rule = DecisionDeny, ReasonProtocol, "no interception CA"
		s.c.Write(tlsAlertAccessDenied)
		return
	}
	host := rec.Host
	tc := tls.Server(&bufConn{Conn: s.c, r: s.br}, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return ca.leaf(host, s.p.cfg.Now())
		},
	})
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		s.log.Debug("egress client TLS handshake", "host", host, "err", err)
		return
	}
	uc := tls.Client(&bufConn{Conn: up, r: upr}, &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: host,
		RootCAs:    s.p.cfg.RootCAs,
		NextProtos: []string{"http/1.1"},
	})
	if err := uc.HandshakeContext(hctx); err != nil {
		rec.Decision, rec.Reason, rec.Rule = DecisionDeny, ReasonUpstreamTLS, "upstream certificate not trusted"
		s.audit(rec)
		s.respond(tc, http.StatusBadGateway, ReasonUpstreamTLS, fmt.Sprintf("space egress: %s:%d upstream TLS failed", host, rec.Port))
		s.log.Info("egress upstream TLS", "host", host, "err", err)
		return
	}
	s.relay(rec, tc, bufio.NewReader(tc), uc, bufio.NewReader(uc), up, true)
}

// relay serves HTTP/1.1 requests inside a tunnel to its one upstream
// (up, counted by cnt). Each request must name the tunnel's host and may
// not CONNECT; placeholders are injected when intercepted is true and
// refused elsewhere. Every request gets its own audit record; the first
// refusal ends the tunnel.
func (s *session) relay(tun *Record, cw net.Conn, br *bufio.Reader, up net.Conn, upbr *bufio.Reader, cnt *countConn, intercepted bool) {
	used := map[string]bool{}
	defer func() {
		if len(used) > 0 {
			tun.Secret = strings.Join(slices.Sorted(maps.Keys(used)), ",")
		}
	}()
	for {
		_ = cw.SetReadDeadline(time.Now().Add(s.p.cfg.IdleTimeout))
		head, err := peekHead(br)
		if err != nil {
			return
		}
		_ = cw.SetReadDeadline(time.Time{})
		rec := &Record{Time: s.p.cfg.Now(), SandboxID: s.sb, Host: tun.Host, IP: tun.IP, Port: tun.Port, SNI: tun.SNI, Rule: tun.Rule}
		refuse := func(status int, reason, rule string) { s.refuse(cw, rec, status, reason, rule) }
		hostHdr := headerValue(head, "host")
		req, err := http.ReadRequest(br)
		if err != nil {
			refuse(http.StatusBadRequest, ReasonProtocol, "malformed HTTP request in tunnel")
			return
		}
		rec.Method = req.Method
		if req.Method == http.MethodConnect {
			refuse(http.StatusForbidden, ReasonNestedConnect, "CONNECT inside a tunnel")
			return
		}
		if !hostMatches(hostHdr, rec.Host, rec.Port) || (req.URL.Host != "" && !hostMatches(req.URL.Host, rec.Host, rec.Port)) {
			refuse(http.StatusForbidden, ReasonHostMismatch, fmt.Sprintf("Host header %q does not match the tunnel", safe(hostHdr)))
			return
		}
		req.Host = hostHdr
		state := s.p.view(s.sb)
		var sc *scrubber
		if intercepted {
			if name := s.p.revokedFor(s.sb, state, rec.Host); name != "" {
				rec.Secret = name
				refuse(http.StatusForbidden, ReasonRevoked, "secret "+name+" is revoked for this sandbox: a request of its own carried the value")
				return
			}
			if sc = newScrubber(state.secrets, rec.Host); sc != nil {
				if name := sc.guessIn(req); name != "" { // before injection: only the sandbox's own text
					s.guessed(rec, cw, name)
					return
				}
			}
		}
		var names []string
		if intercepted {
			for _, b := range state.secrets {
				if b.matchHost(rec.Host, rec.Port) && b.inject(req) {
					names = append(names, b.secret.Name)
				}
			}
		}
		if leaked := placeholdersIn(req, state.secrets); leaked != nil {
			rec.Secret = strings.Join(leaked, ",")
			refuse(http.StatusForbidden, ReasonLeak, "secret placeholder may not be sent to this host")
			return
		}
		rec.Secret = strings.Join(names, ",")
		for _, n := range names {
			used[n] = true
		}
		var guard *guardReader
		if sc != nil && req.Body != nil && req.Body != http.NoBody {
			guard = &guardReader{sc: sc, r: req.Body}
			req.Body = guard
		}
		u0, d0 := cnt.up.Load(), cnt.down.Load()
		closeAfter, ws, err := roundTrip(req, cw, up, upbr, sc)
		switch {
		case errors.Is(err, errUpgrade):
			rec.BytesUp, rec.BytesDown = cnt.up.Load()-u0, cnt.down.Load()-d0
			refuse(http.StatusBadGateway, ReasonProtocol, "only WebSocket upgrades are let through")
			return
		case guard != nil && guard.found != "":
			rec.BytesUp, rec.BytesDown = cnt.up.Load()-u0, cnt.down.Load()-d0
			s.guessed(rec, cw, guard.found)
			return
		case errors.Is(err, errEncoded):
			rec.BytesUp, rec.BytesDown = cnt.up.Load()-u0, cnt.down.Load()-d0
			refuse(http.StatusBadGateway, ReasonEncoded, "the response of a host holding a secret must be readable: an identity or gzip body, or a WebSocket without extensions")
			return
		case errors.Is(err, errPartial):
			rec.BytesUp, rec.BytesDown = cnt.up.Load()-u0, cnt.down.Load()-d0
			refuse(http.StatusBadGateway, ReasonPartial, "a host holding a secret answered with a part of a body (206): the proxy asks for whole ones")
			return
		}
		if ws != nil {
			// Pinned: the WebSocket stays on this upstream connection, and
			// the client may send only frames on it (wsclient.go).
			var down io.Reader = upbr
			if sc != nil {
				down = newWSScrubReader(sc, upbr) // no extensions: roundTrip refused them
			}
			cr := newWSClientReader(br, ws.ext, sc)
			cr.onGuess = func(name string) { s.p.revoke(s.sb, name, s.t) }
			pipe(cw, cr, up, down)
			rec.BytesUp, rec.BytesDown = cnt.up.Load()-u0, cnt.down.Load()-d0
			if name := cr.guessed(); name != "" {
				rec.Secret, rec.Decision, rec.Reason, rec.Rule = name, DecisionDeny, ReasonSecretValue, "a WebSocket message carried the value of secret "+name+": it is revoked for this sandbox"
				s.log.Warn("egress: the sandbox sent a secret's value; the secret is revoked for it", "secret", name, "host", rec.Host)
			}
			s.audit(rec)
			return
		}
		rec.BytesUp, rec.BytesDown = cnt.up.Load()-u0, cnt.down.Load()-d0
		s.audit(rec)
		if err != nil || closeAfter {
			return
		}
	}
}

// guessed refuses a request that carried the value of secret name and
// revokes the secret for the sandbox (guess.go).
func (s *session) guessed(rec *Record, cw io.Writer, name string) {
	s.p.revoke(s.sb, name, s.t) // before the answer: the sandbox's next request sees it
	rec.Secret = name
	s.log.Warn("egress: the sandbox sent a secret's value; the secret is revoked for it", "secret", name, "host", rec.Host)
	s.refuse(cw, rec, http.StatusForbidden, ReasonSecretValue, "the request carries the value of secret "+name+": it is revoked for this sandbox")
}

// roundTrip forwards one request and its response; sc, when set, scrubs
// the response of the secrets its host holds (errEncoded: nothing was
// written to cw, the caller answers).
func roundTrip(req *http.Request, cw io.Writer, up io.Writer, upbr *bufio.Reader, sc *scrubber) (closeAfter bool, ws *wsUpgrade, err error) {
	h := req.Header
	// Only WebSocket upgrades (wsclient.go): another protocol (h2c) is not
	// asked for, and a 101 to it is refused.
	wantWS := strings.EqualFold(strings.TrimSpace(h.Get("Upgrade")), "websocket")
	if !wantWS {
		h.Del("Upgrade")
		h.Del("Http2-Settings")
	}
	h.Del("Proxy-Authorization")
	h.Del("Proxy-Connection")
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = []string{""} // keep net/http from adding its own
	}
	if req.Close {
		h.Del("Connection") // req.Write adds "Connection: close" itself
	}
	if strings.EqualFold(h.Get("Expect"), "100-continue") {
		h.Del("Expect")
		if _, err := io.WriteString(cw, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return true, nil, err
		}
	}
	if sc != nil {
		sc.prepare(req)
	}
	if err := req.Write(up); err != nil {
		return true, nil, err
	}
	for {
		resp, err := http.ReadResponse(upbr, req)
		if err != nil {
			return true, nil, err
		}
		if sc != nil {
			if err := sc.response(req, resp); err != nil {
				resp.Body.Close()
				return true, nil, err
			}
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			// A WebSocket the client asked for, nothing else: after the
			// 101 the proxy reads no HTTP, so another protocol could carry
			// requests for other hosts.
			if !wantWS || !strings.EqualFold(strings.TrimSpace(resp.Header.Get("Upgrade")), "websocket") {
				resp.Body.Close()
				return true, nil, errUpgrade
			}
			// From a host holding a secret only a WebSocket without
			// extensions (its frames are scrubbed: wsscrub.go).
			ext := resp.Header.Get("Sec-WebSocket-Extensions") != ""
			if sc != nil && ext {
				resp.Body.Close()
				return true, nil, errEncoded
			}
			if err := resp.Write(cw); err != nil {
				return true, nil, err
			}
			return true, &wsUpgrade{ext: ext}, nil
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			if err := resp.Write(cw); err != nil {
				return true, nil, err
			}
			continue
		}
		// Buffer the head and each body chunk, but flush before every body
		// read so streamed responses (SSE, long polls) are not held back.
		bw := bufio.NewWriterSize(cw, 32<<10)
		body := resp.Body
		resp.Body = flushReader{r: body, w: bw}
		err = resp.Write(writerOnly{bw}) // hide bufio's ReadFrom: it reads into its own buffer, which the flush would reuse
		if ferr := bw.Flush(); err == nil {
			err = ferr
		}
		body.Close()
		return req.Close || resp.Close || err != nil, nil, err
	}
}

// wsUpgrade is a WebSocket a 101 let through.
type wsUpgrade struct {
	ext bool // an extension was agreed (never toward a host holding a secret)
}

// errUpgrade refuses a 101 to anything but a WebSocket the client asked for.
var errUpgrade = errors.New("upgrade to a protocol other than WebSocket")

type writerOnly struct{ io.Writer }

type flushReader struct {
	r io.Reader
	w *bufio.Writer
}

func (f flushReader) Read(p []byte) (int, error) {
	if err := f.w.Flush(); err != nil {
		return 0, err
	}
	return f.r.Read(p)
}

func (f flushReader) Close() error { return nil }

// inject puts the secret's value where its Injection says, if the request
// carries the placeholder there. It reports whether it did.
func (b *boundSecret) inject(req *http.Request) bool {
	ph, val := b.placeholder, string(b.secret.Value)
	inj := b.secret.Inject
	done := false
	switch {
	case inj.Header != "":
		key := http.CanonicalHeaderKey(inj.Header)
		for i, v := range req.Header[key] {
			switch {
			case v == ph:
				f := inj.Format
				if f == "" {
					f = "{value}"
				}
				req.Header[key][i] = strings.ReplaceAll(f, "{value}", val)
				done = true
			case strings.Contains(v, ph):
				req.Header[key][i] = strings.ReplaceAll(v, ph, val)
				done = true
			}
		}
	case inj.BasicAuth != nil:
		for i, v := range req.Header["Authorization"] {
			user := inj.BasicAuth.User
			if v == ph {
				req.Header["Authorization"][i] = "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+val))
				done = true
				continue
			}
			scheme, cred, ok := strings.Cut(v, " ")
			if !ok || !strings.EqualFold(scheme, "basic") {
				continue
			}
			dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
			if err != nil {
				continue
			}
			u, pw, ok := strings.Cut(string(dec), ":")
			if !ok || !strings.Contains(pw, ph) {
				continue
			}
			if user != "" {
				u = user
			}
			req.Header["Authorization"][i] = "Basic " + base64.StdEncoding.EncodeToString([]byte(u+":"+strings.ReplaceAll(pw, ph, val)))
			done = true
		}
	case inj.QueryParam != "":
		parts := strings.Split(req.URL.RawQuery, "&")
		for i, part := range parts {
			k, v, _ := strings.Cut(part, "=")
			uk, err := url.QueryUnescape(k)
			if err != nil || uk != inj.QueryParam {
				continue
			}
			uv, err := url.QueryUnescape(v)
			if err != nil || !strings.Contains(uv, ph) {
				continue
			}
			parts[i] = k + "=" + url.QueryEscape(strings.ReplaceAll(uv, ph, val))
			done = true
		}
		if done {
			req.URL.RawQuery = strings.Join(parts, "&")
		}
	}
	return done
}

// placeholdersIn returns the names of the secrets whose placeholders the
// request head still carries ("unknown" for a placeholder-shaped string
// of no bound secret), or nil. It looks at the target, every header name
// and value, and decoded basic-auth credentials.
func placeholdersIn(req *http.Request, secrets []*boundSecret) []string {
	var texts []string
	add := func(s string) {
		texts = append(texts, s)
		if u, err := url.PathUnescape(s); err == nil && u != s {
			texts = append(texts, u)
		}
	}
	add(req.URL.Host)
	add(req.URL.RequestURI())
	add(req.Host)
	for k, vs := range req.Header {
		add(k)
		for _, v := range vs {
			add(v)
			if scheme, cred, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "basic") {
				if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred)); err == nil {
					add(string(dec))
				}
			}
		}
	}
	var names []string
	unknown := false
	for _, t := range texts {
		lt := strings.ToLower(t)
		if !strings.Contains(lt, PlaceholderPrefix) {
			continue
		}
		found := false
		for _, b := range secrets {
			if strings.Contains(lt, b.placeholder) {
				found = true
				if !slices.Contains(names, b.secret.Name) {
					names = append(names, b.secret.Name)
				}
			}
		}
		if !found {
			unknown = true
		}
	}
	if unknown {
		names = append(names, "unknown")
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return names
}
