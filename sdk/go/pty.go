package space

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// PTYConn is an interactive terminal in a sandbox. Read returns terminal
// output and io.EOF once the shell has exited (ExitCode is then valid); Write
// sends keystrokes. Read and Write may be used from different goroutines.
type PTYConn struct {
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	out    *io.PipeReader
	done   chan struct{}

	mu       sync.Mutex
	exitCode int
	exited   bool
}

// PTY opens a terminal running cmd (empty: the server's default shell) of the
// given size. ctx bounds the whole session; Close ends it early.
func (c *Client) PTY(ctx context.Context, id string, cols, rows int, cmd string) (*PTYConn, error) {
	q := url.Values{}
	if cols > 0 {
		q.Set("cols", strconv.Itoa(cols))
	}
	if rows > 0 {
		q.Set("rows", strconv.Itoa(rows))
	}
	if cmd != "" {
		q.Set("cmd", cmd)
	}
	u, err := c.endpoint("/v1/sandboxes/"+seg(id)+"/pty", q)
	if err != nil {
		return nil, err
	}
	switch {
	case strings.HasPrefix(u, "http://"):
		u = "ws://" + strings.TrimPrefix(u, "http://")
	case strings.HasPrefix(u, "https://"):
		u = "wss://" + strings.TrimPrefix(u, "https://")
	}
	h := http.Header{}
	if c.apiKey != "" {
		h.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.ua != "" {
		h.Set("User-Agent", c.ua)
	}
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			if resp.Body == nil {
				resp.Body = http.NoBody
			}
			return nil, decodeError(resp)
		}
		return nil, fmt.Errorf("space: open pty: %w", err)
	}
	ws.SetReadLimit(4 << 20)
	pctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	p := &PTYConn{ws: ws, ctx: pctx, cancel: cancel, out: pr, done: make(chan struct{})}
	go p.readLoop(pw)
	return p, nil
}

// readLoop copies binary messages to the output pipe and watches for the exit
// message.
func (p *PTYConn) readLoop(pw *io.PipeWriter) {
	defer close(p.done)
	for {
		typ, b, err := p.ws.Read(p.ctx)
		if err != nil {
			p.mu.Lock()
			exited := p.exited
			p.mu.Unlock()
			if exited || websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				pw.Close()
			} else {
				pw.CloseWithError(fmt.Errorf("space: pty: %w", err))
			}
			return
		}
		if typ == websocket.MessageText {
			var m struct {
				Type     string `json:"type"`
				ExitCode int    `json:"exit_code"`
			}
			if json.Unmarshal(b, &m) == nil && m.Type == "exit" {
				p.mu.Lock()
				p.exited, p.exitCode = true, m.ExitCode
				p.mu.Unlock()
			}
			continue
		}
		if _, err := pw.Write(b); err != nil {
			return // reader closed
		}
	}
}

// Read reads terminal output.
func (p *PTYConn) Read(b []byte) (int, error) { return p.out.Read(b) }

// Write sends terminal input.
func (p *PTYConn) Write(b []byte) (int, error) {
	if err := p.ws.Write(p.ctx, websocket.MessageBinary, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Resize changes the terminal's size.
func (p *PTYConn) Resize(cols, rows int) error {
	b, _ := json.Marshal(struct {
		Type string `json:"type"`
		Cols int    `json:"cols"`
		Rows int    `json:"rows"`
	}{"resize", cols, rows})
	return p.ws.Write(p.ctx, websocket.MessageText, b)
}

// ExitCode returns the shell's exit code, and false if the server has not
// reported one (yet).
func (p *PTYConn) ExitCode() (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitCode, p.exited
}

// Wait blocks until the session ends and returns the exit code; an error if the
// connection broke before the server reported one. Output must be drained
// (by Read) for the session to end.
func (p *PTYConn) Wait() (int, error) {
	select {
	case <-p.done:
	case <-p.ctx.Done():
	}
	if code, ok := p.ExitCode(); ok {
		return code, nil
	}
	return -1, errors.New("space: pty closed without an exit status")
}

// Close ends the session.
func (p *PTYConn) Close() error {
	err := p.ws.Close(websocket.StatusNormalClosure, "")
	p.cancel()
	p.out.Close()
	return err
}
