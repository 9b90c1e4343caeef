package egress

import (
	"errors"
	"io"
	"net/http"
	"net/url"
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
// the scrubber covers are searched; a match refuses the request (403
// secret_value, audited) and revokes the secret for the sandbox: from then
// on every request to that secret's hosts is refused (secret_revoked),
// so no response the scrubber rewrote, or any other, can answer a further
// guess. The sandbox learns one bit once ("some request held the value")
// and nothing more. A guess the host must first transform (JSON \u
// escapes it decodes) is outside what the proxy can see; the host's own
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
		texts = append(texts, k)
		texts = append(texts, vs...)
	}
	for _, t := range texts {
		if n := sc.find([]byte(t)); n != nil {
			return n.name
		}
	}
	return ""
}

// guardReader passes a request body (or a client's WebSocket payloads)
// on and fails with errGuess at the first read that completes a secret's
// value; found names the secret. It keeps the last bytes it read so a
// value split across reads is seen.
type guardReader struct {
	sc    *scrubber
	r     io.Reader
	win   []byte
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
	if nd := g.sc.find(g.win); nd != nil {
		g.found = nd.name
		return 0, errGuess
	}
	if keep := g.sc.max - 1; len(g.win) > keep {
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
// binding does not undo it).
func (p *Proxy) revoke(sandboxID, name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.revoked[sandboxID] == nil {
		p.revoked[sandboxID] = map[string]bool{}
	}
	p.revoked[sandboxID][name] = true
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
