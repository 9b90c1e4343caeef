// Package portproxy reverse-proxies HTTP (and WebSocket upgrades) to a port
// inside a sandbox. A sandbox has no network of its own: each connection is
// a stream of its agent session (sandbox.Service.DialPort), so this is the
// only way in, and it goes only where the caller was allowed to go.
package portproxy

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Dialer opens a connection to port of sandbox id. ctx carries what the
// caller put there with WithValue before Serve (its identity).
type Dialer func(ctx context.Context, id string, port int) (net.Conn, error)

// Proxy forwards requests to sandbox ports. Connections are kept alive per
// sandbox and port for a short while and reused.
type Proxy struct {
	tr *http.Transport
}

// poolHost names a sandbox port in the transport's URL (its pool key).
const poolSuffix = ".sandbox.invalid"

// New returns a Proxy that dials with dial.
func New(dial Dialer) *Proxy {
	return &Proxy{tr: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			p, id, ok := strings.Cut(strings.TrimSuffix(host, poolSuffix), ".")
			port, perr := strconv.Atoi(p)
			if !ok || perr != nil {
				return nil, fmt.Errorf("portproxy: bad address %q", addr)
			}
			return dial(ctx, id, port)
		},
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // a long poll may take as long as it likes
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}}
}

// CredentialHeaders carry space's or E2B's credentials under names of
// their own: they are for space, never for the sandbox, and are always
// removed. Authorization is not among them: it is the app's own header
// (basic auth, a notebook's token) unless the caller's API key came in it,
// which the caller of Serve knows and says with strip.
var CredentialHeaders = []string{"X-Api-Key", "X-Access-Token", "E2b-Traffic-Access-Token"}

// Serve forwards r to port of sandbox id with path as its path, escaped
// as the client sent it (the query is kept): an app that routes on
// escaped paths (`a%2Fb` is one segment) gets what the client asked for,
// not `a/b`. The inbound Host is kept (dev servers check it);
// CredentialHeaders and the headers in strip are removed; X-Forwarded-*
// are set. Failures before the sandbox answered go to onError. ctx values
// of r reach the Dialer.
func (p *Proxy) Serve(w http.ResponseWriter, r *http.Request, id string, port int, path string, strip []string, onError func(http.ResponseWriter, *http.Request, error)) {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = strconv.Itoa(port) + "." + id + poolSuffix
			if p, err := url.PathUnescape(path); err == nil {
				pr.Out.URL.Path, pr.Out.URL.RawPath = p, path
			} else {
				pr.Out.URL.Path, pr.Out.URL.RawPath = path, ""
			}
			for _, h := range CredentialHeaders {
				pr.Out.Header.Del(h)
			}
			for _, h := range strip {
				pr.Out.Header.Del(h)
			}
			pr.SetXForwarded()
		},
		Transport:     p.tr,
		FlushInterval: -1, // event streams and long polls pass at once
		ErrorHandler:  onError,
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	rp.ServeHTTP(w, r)
}

// Close drops the idle connections.
func (p *Proxy) Close() { p.tr.CloseIdleConnections() }
