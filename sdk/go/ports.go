package space

import (
	"fmt"
	"net/http"
	"net/url"
)

// PortURL is the URL under which port of sandbox id is reached through the
// server (GET /v1/sandboxes/{id}/ports/{port}/…): append the path the
// server in the sandbox expects. Requests need the API key, as
// X-API-Key (then an Authorization header of the request is the app's and
// reaches it) or as an Authorization Bearer token (then it does not);
// PortTransport adds it as X-API-Key.
func (c *Client) PortURL(id string, port int) string {
	u, _ := c.endpoint(portPath(id, port), nil)
	return u
}

// portPath is the API path of port of sandbox id.
func portPath(id string, port int) string {
	return fmt.Sprintf("/v1/sandboxes/%s/ports/%d", seg(id), port)
}

// PortTransport returns an http.RoundTripper that sends every request to
// port of sandbox id, whatever its URL's host: keep the request's path and
// query, swap the scheme and host for the server's, add the API key (as
// X-API-Key: the request's own Authorization reaches the app). With
// it, any HTTP client (and anything built on one) talks to a server in the
// sandbox as if it were local:
//
//	hc := &http.Client{Transport: c.PortTransport(id, 8000)}
//	resp, err := hc.Get("http://sandbox/api/items?page=2")
//
// Errors from space itself (the sandbox is gone, nothing listens on the
// port) arrive as responses with space's JSON error body; the server in
// the sandbox answers everything else.
func (c *Client) PortTransport(id string, port int) http.RoundTripper {
	return &portTransport{c: c, id: id, port: port}
}

type portTransport struct {
	c    *Client
	id   string
	port int
}

func (t *portTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	target, err := t.c.endpoint(portPath(t.id, t.port)+req.URL.Path, nil)
	if err != nil {
		return nil, err
	}
	out := req.Clone(req.Context())
	if out.URL, err = url.Parse(target); err != nil {
		return nil, err
	}
	out.URL.RawQuery = req.URL.RawQuery
	out.Host = ""
	if t.c.apiKey != "" {
		out.Header.Set("X-API-Key", t.c.apiKey)
	}
	if t.c.ua != "" && out.Header.Get("User-Agent") == "" {
		out.Header.Set("User-Agent", t.c.ua)
	}
	tr := t.c.hc.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	return tr.RoundTrip(out)
}
