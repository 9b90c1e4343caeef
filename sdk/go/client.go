// Package space is the Go client for a space server's REST API (/v1).
//
// It owns the wire types of the public API and the HTTP, SSE and WebSocket
// plumbing to reach them; it depends only on the standard library and
// github.com/coder/websocket (for PTYs), so programs that embed it do not pull
// in server dependencies. The API is described in api/openapi.yaml.
//
// Every method takes a context that bounds the whole call, including reading a
// streamed response. Errors returned by the server are *APIError values; use
// IsNotFound, IsConflict and friends (or errors.Is with ErrNotFound, …) to
// classify them.
package space

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// Client talks to one space server. It is safe for concurrent use.
type Client struct {
	base   *url.URL
	apiKey string
	hc     *http.Client
	ua     string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send requests through hc instead of the
// default (DefaultHTTPClient). Do not give hc a Timeout if you stream: it would
// cut off long exec streams and downloads; bound calls with contexts instead.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithUserAgent sets the User-Agent header sent with every request.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.ua = ua }
}

// DefaultHTTPClient is what a Client uses unless WithHTTPClient says
// otherwise: http.DefaultTransport's settings, but keeping up to 64 idle
// connections to the server instead of 2, so an agent that runs many calls
// at once (twenty creates, execs in parallel) reuses its connections
// instead of opening and closing one per call.
var DefaultHTTPClient = &http.Client{Transport: defaultTransport()}

func defaultTransport() http.RoundTripper {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport
	}
	t = t.Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}

// NewClient returns a client for the server at baseURL (for example
// "http://127.0.0.1:7070"; a trailing "/v1" is tolerated) authenticating with
// apiKey. An unparsable baseURL makes every call fail with that parse error.
func NewClient(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{apiKey: apiKey, hc: DefaultHTTPClient, ua: "space-sdk-go"}
	trimmed := strings.TrimSuffix(strings.TrimRight(baseURL, "/"), "/v1")
	if u, err := url.Parse(trimmed); err == nil && u.Scheme != "" && u.Host != "" {
		c.base = u
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// BaseURL returns the server URL the client talks to.
func (c *Client) BaseURL() string {
	if c.base == nil {
		return ""
	}
	return c.base.String()
}

// endpoint joins the base URL, path segments (escaped) and query.
func (c *Client) endpoint(path string, q url.Values) (string, error) {
	if c.base == nil {
		return "", fmt.Errorf("space: invalid server URL")
	}
	u := *c.base
	u.Path = strings.TrimRight(u.Path, "/") + path
	u.RawPath = ""
	if len(q) > 0 {
		u.RawQuery = q.Encode()
	}
	return u.String(), nil
}

// seg escapes one path segment (a sandbox id, a template name…).
func seg(s string) string { return url.PathEscape(s) }

// request is one API call.
type request struct {
	method string
	path   string
	query  url.Values
	body   io.Reader // sent as is; contentType describes it
	json   any       // marshalled as the body when body is nil
	header http.Header
	ctype  string
}

// send performs r and returns the response when its status is 2xx; any other
// status is decoded into an *APIError and the body closed.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	u, err := c.endpoint(r.path, r.query)
	if err != nil {
		return nil, err
	}
	body, ctype := r.body, r.ctype
	if body == nil && r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("space: encode request: %w", err)
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	length := int64(-1)
	if body != nil {
		// Hide the caller's reader behind a plain io.Reader: the transport
		// closes request bodies, and a caller's *os.File is not ours to close.
		length = bodyLength(body)
		if length == 0 {
			body = http.NoBody
		} else {
			body = struct{ io.Reader }{body}
		}
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return nil, err
	}
	if length > 0 {
		req.ContentLength = length
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "application/json")
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.ua != "" {
		req.Header.Set("User-Agent", c.ua)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// bodyLength returns how many bytes r will yield, or -1 when unknown (the body
// is then sent chunked, as it is read).
func bodyLength(r io.Reader) int64 {
	switch b := r.(type) {
	case interface{ Len() int }: // *bytes.Reader, *bytes.Buffer, *strings.Reader
		return int64(b.Len())
	case *os.File:
		st, err := b.Stat()
		// A regular file of size 0 may still have content (/proc,
		// /sys): sent chunked, as read, not as an empty body.
		if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
			return -1
		}
		off, err := b.Seek(0, io.SeekCurrent)
		if err != nil || off > st.Size() {
			return -1
		}
		return st.Size() - off
	}
	if r == http.NoBody {
		return 0
	}
	return -1
}

// do performs r and decodes a JSON response into out (when out is non-nil).
func (c *Client) do(ctx context.Context, r request, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("space: decode %s %s response: %w", r.method, r.path, err)
	}
	return nil
}
