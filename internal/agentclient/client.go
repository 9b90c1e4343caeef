// Package agentclient is the host side of the agent protocol: it speaks
// HTTP/1.1 over yamux streams to the space-agent inside a sandbox.
//
// One Client keeps one yamux session to one agent, dialed lazily and
// redialed on the next use after it died. Errors carry errdefs classes: the
// agent's own error codes, or errdefs.ErrUnavailable when the agent could
// not be reached.
package agentclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Client talks to one agent. It is safe for concurrent use.
type Client struct {
	dial func(ctx context.Context) (net.Conn, error)
	log  *slog.Logger

	mu      sync.Mutex
	cur     *session
	dialing *dialCall
	closed  bool
	streams StreamHandler // agent-initiated streams; nil: refused
	keeping bool          // a keeper goroutine holds a session open
}

// StreamHandler serves one stream the agent opened (kind is the stream's
// first line, e.g. agentproto.StreamEgress). It owns c.
type StreamHandler func(kind string, c net.Conn)

// session is one yamux session with the HTTP client bound to it; a dead
// session's pooled streams die with its transport.
type session struct {
	ys *yamux.Session
	tr *http.Transport
	hc *http.Client
}

func (s *session) close() {
	s.ys.Close()
	s.tr.CloseIdleConnections()
}

type dialCall struct {
	done chan struct{}
	s    *session
	err  error
}

// New returns a Client that reaches the agent through connections made by
// dial. Nothing is dialed until the first request.
func New(dial func(ctx context.Context) (net.Conn, error), log *slog.Logger) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{dial: dial, log: log}
}

// Close ends the session; later calls fail with errdefs.ErrUnavailable.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	s := c.cur
	c.cur = nil
	c.mu.Unlock()
	if s != nil {
		s.close()
	}
	return nil
}

// session returns the live session, dialing a new one if there is none.
// Concurrent callers share one in-flight dial.
func (c *Client) session(ctx context.Context) (*session, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errdefs.Unavailable("agent client closed")
	}
	if s := c.cur; s != nil && !s.ys.IsClosed() {
		c.mu.Unlock()
		return s, nil
	}
	call := c.dialing
	if call == nil {
		call = &dialCall{done: make(chan struct{})}
		c.dialing = call
		old := c.cur
		c.cur = nil
		go func() {
			if old != nil {
				old.close()
			}
			s, err := c.connect(ctx)
			c.mu.Lock()
			call.s, call.err = s, err
			c.dialing = nil
			if err == nil {
				if c.closed {
					s.close()
					call.s, call.err = nil, errdefs.Unavailable("agent client closed")
				} else {
					c.cur = s
				}
			}
			c.mu.Unlock()
			close(call.done)
		}()
	}
	c.mu.Unlock()
	select {
	case <-call.done:
		return call.s, call.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// connect dials the agent and starts a yamux client session over the
// connection. The dial is bounded by ctx of the caller that started it.
func (c *Client) connect(ctx context.Context) (*session, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("dial agent: %w: %w", errdefs.ErrUnavailable, err)
	}
	ys, err := yamux.Client(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("agent session: %w: %w", errdefs.ErrUnavailable, err)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			st, err := ys.OpenStream()
			if err != nil {
				return nil, &openError{err}
			}
			return st, nil
		},
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		// An agent's header block is a few lines; without a bound the
		// transport accepts 1 MiB.
		MaxResponseHeaderBytes: MaxHeaderBytes,
		WriteBufferSize:        64 << 10,
		ReadBufferSize:         64 << 10,
	}
	c.log.Debug("agent session started")
	c.mu.Lock()
	h := c.streams
	c.mu.Unlock()
	if h != nil {
		go c.acceptStreams(ys, h)
	}
	return &session{ys: ys, tr: tr, hc: &http.Client{Transport: tr}}, nil
}

// HandleStreams serves streams the agent opens (the egress tunnel) with h,
// and from now on keeps a session to the agent up at all times, redialing
// as soon as one breaks, so the agent always has a way to reach the host.
func (c *Client) HandleStreams(h StreamHandler) {
	c.mu.Lock()
	c.streams = h
	if cur := c.cur; cur != nil {
		go c.acceptStreams(cur.ys, h)
	}
	start := !c.keeping
	c.keeping = true
	c.mu.Unlock()
	if start {
		go c.keep()
	}
}

// keep re-establishes the session whenever it dies, until Close.
func (c *Client) keep() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
		s, err := c.session(dctx)
		dcancel()
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		<-s.ys.CloseChan()
	}
}

func (c *Client) acceptStreams(ys *yamux.Session, h StreamHandler) {
	open := make(chan struct{}, MaxAgentStreams) // a token per stream open
	for {
		st, err := ys.AcceptStream()
		if err != nil {
			return
		}
		select {
		case open <- struct{}{}:
		default:
			// The agent opened more streams than any sandbox needs: each
			// holds a receive window of host memory.
			c.log.Warn("agent opened too many streams; refusing", "limit", MaxAgentStreams)
			st.Close()
			continue
		}
		go func() {
			st.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReaderSize(st, maxStreamKind)
			line, err := br.ReadSlice('\n')
			if err != nil {
				st.Close()
				<-open
				return
			}
			st.SetReadDeadline(time.Time{})
			h(strings.TrimSpace(string(line)), &bufferedConn{Conn: st, r: br, done: func() { <-open }})
		}()
	}
}

// bufferedConn is a stream whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r    *bufio.Reader
	done func() // called once at Close (nil: nothing)
	once sync.Once
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *bufferedConn) Close() error {
	if b.done != nil {
		b.once.Do(b.done)
	}
	return b.Conn.Close()
}

func yamuxConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.MaxStreamWindowSize = 4 << 20
	cfg.AcceptBacklog = 1024
	cfg.LogOutput = io.Discard
	return cfg
}

// openError marks a failure to open a stream: nothing was sent, so the
// request can be retried on a fresh session.
type openError struct{ err error }

func (e *openError) Error() string { return "open stream: " + e.err.Error() }
func (e *openError) Unwrap() error { return e.err }

// request describes one call.
type request struct {
	method string
	path   string
	query  url.Values
	body   io.Reader // sent as is (raw bodies)
	json   any       // marshaled as the body when set
	accept string    // Accept header, when set
}

// do sends req and returns the response when it is 2xx; otherwise the
// agent's error with its class. The caller closes the body.
func (c *Client) do(ctx context.Context, req request) (*http.Response, error) {
	var payload []byte
	if req.json != nil {
		var err error
		if payload, err = json.Marshal(req.json); err != nil {
			return nil, errdefs.InvalidArgument("encode request: %v", err)
		}
	}
	u := "http://agent" + req.path
	if len(req.query) > 0 {
		u += "?" + req.query.Encode()
	}
	for attempt := 0; ; attempt++ {
		s, err := c.session(ctx)
		if err != nil {
			return nil, transportError(ctx, err)
		}
		body := req.body
		if payload != nil {
			body = bytes.NewReader(payload)
		}
		hreq, err := http.NewRequestWithContext(ctx, req.method, u, body)
		if err != nil {
			return nil, errdefs.InvalidArgument("build request: %v", err)
		}
		if req.accept != "" {
			hreq.Header.Set("Accept", req.accept)
		}
		if payload != nil {
			hreq.Header.Set("Content-Type", "application/json")
		} else if req.body != nil {
			// Keep the caller's reader open: the transport closes bodies.
			hreq.Body = io.NopCloser(req.body)
		}
		resp, err := s.hc.Do(hreq)
		if err != nil {
			var oe *openError
			if attempt == 0 && errors.As(err, &oe) && ctx.Err() == nil {
				continue // the session died before anything was sent: redial once
			}
			return nil, transportError(ctx, err)
		}
		if resp.StatusCode/100 != 2 {
			defer resp.Body.Close()
			return nil, decodeError(resp)
		}
		return resp, nil
	}
}

// UnaryTimeout bounds a call that streams no request body when its context
// has no deadline of its own: an agent that stopped answering (a sandbox
// thrashing at its memory limit, say) must not hold an API request, and the
// goroutine serving it, forever. A variable so tests can shorten it.
var UnaryTimeout = time.Minute

// call does req and decodes a JSON response of at most MaxUnaryAnswer
// bytes into out (if non-nil).
func (c *Client) call(ctx context.Context, req request, out any) error {
	return c.roundTrip(ctx, req, func(body io.Reader, what string) error {
		if out == nil {
			return nil
		}
		return decodeOne(body, MaxUnaryAnswer, what, out)
	})
}

// callList does req and decodes a JSON array of at most maxItems elements
// and MaxListAnswer bytes.
func callList[T any](ctx context.Context, c *Client, req request, maxItems int) ([]T, error) {
	var out []T
	err := c.roundTrip(ctx, req, func(body io.Reader, what string) error {
		var err error
		out, err = decodeList[T](body, MaxListAnswer, maxItems, what)
		return err
	})
	return out, err
}

// roundTrip does req, bounded by UnaryTimeout when it streams no request
// body and ctx has no deadline, and hands the answer's body to decode.
// What decode leaves unread is discarded (closing the body drops the
// stream: an agent sending more is not read further).
func (c *Client) roundTrip(ctx context.Context, req request, decode func(body io.Reader, what string) error) error {
	if _, ok := ctx.Deadline(); !ok && req.body == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, UnaryTimeout)
		defer cancel()
	}
	resp, err := c.do(ctx, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	what := req.method + " " + req.path
	if err := decode(resp.Body, what); err != nil {
		if errors.Is(err, errdefs.ErrTooLarge) {
			return err
		}
		return transportError(ctx, fmt.Errorf("decode %s response: %w", req.path, err))
	}
	return nil
}

func transportError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			return fmt.Errorf("agent request: %w: %w", errdefs.ErrDeadline, ctxErr)
		}
		return fmt.Errorf("agent request: %w", ctxErr)
	}
	if errors.Is(err, errdefs.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("agent unreachable: %w: %w", errdefs.ErrUnavailable, err)
}

func decodeError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
	var e agentproto.Error
	if json.Unmarshal(body, &e) != nil || e.Code == "" {
		e.Code = codeForStatus(resp.StatusCode)
		e.Message = fmt.Sprintf("agent: %s", resp.Status)
	}
	return errdefs.Newf(errdefs.FromCode(e.Code), "%s", e.Message)
}

func codeForStatus(status int) string {
	for _, c := range errdefs.Classes {
		if c.Status == status {
			return c.Code
		}
	}
	return "internal"
}
