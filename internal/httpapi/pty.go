package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// pty runs a command on a pseudo-terminal and bridges it to a WebSocket:
// binary messages carry terminal bytes both ways; the client sends text
// messages {"type":"resize","cols":N,"rows":N}; the server ends with a text
// message {"type":"exit","exit_code":N} and a normal close.
func (a *API) pty(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	// The handshake is checked before a process starts (the WebSocket
	// library would answer a plain-text error after it).
	if !headerHasToken(r.Header, "Connection", "upgrade") || !headerHasToken(r.Header, "Upgrade", "websocket") ||
		r.Header.Get("Sec-WebSocket-Version") != "13" {
		w.Header().Set("Upgrade", "websocket")
		w.Header().Set("Sec-WebSocket-Version", "13")
		a.writeError(w, r, errdefs.Newf(errdefs.ErrUpgradeRequired, "this endpoint is a WebSocket (version 13): send Connection: Upgrade, Upgrade: websocket"))
		return
	}
	if r.Header.Get("Sec-WebSocket-Key") == "" {
		a.writeError(w, r, errdefs.InvalidArgument("missing Sec-WebSocket-Key"))
		return
	}
	q := r.URL.Query()
	size := agentproto.PTYSize{Cols: 80, Rows: 24}
	for _, p := range []struct {
		name string
		dst  *uint16
	}{{"cols", &size.Cols}, {"rows", &size.Rows}} {
		if s := q.Get(p.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 1000 {
				a.writeError(w, r, errdefs.InvalidArgument("%s: must be between 1 and 1000", p.name))
				return
			}
			*p.dst = uint16(n)
		}
	}
	cmd := []string{"/bin/bash", "-l"}
	if s := q.Get("cmd"); s != "" {
		cmd = []string{s}
	}
	id := r.PathValue("id")
	pid, err := a.svc.Exec(r.Context(), c, id, sandbox.ExecRequest{Cmd: cmd, PTY: &size, User: q.Get("user"), Cwd: q.Get("cwd")})
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		_ = a.svc.Signal(context.WithoutCancel(r.Context()), c, id, pid, "SIGKILL")
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	ev, err := a.svc.Events(ctx, c, id, pid, 1, true)
	if err != nil {
		// Nobody will ever read or end this terminal (a login shell
		// waits on its stdin for good): it goes with the refusal.
		_ = a.svc.Signal(context.WithoutCancel(ctx), c, id, pid, "SIGKILL")
		conn.Close(websocket.StatusInternalError, "events: "+err.Error())
		return
	}
	defer ev.Close()

	// Client → terminal.
	go func() {
		defer cancel()
		for {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				// The client left: hang up the terminal.
				_ = a.svc.Signal(context.WithoutCancel(ctx), c, id, pid, "SIGHUP")
				return
			}
			switch typ {
			case websocket.MessageBinary:
				if err := a.svc.Stdin(ctx, c, id, pid, bytes.NewReader(data), false); err != nil {
					return
				}
			case websocket.MessageText:
				var msg struct {
					Type string `json:"type"`
					Cols uint16 `json:"cols"`
					Rows uint16 `json:"rows"`
					Data string `json:"data"`
				}
				if json.Unmarshal(data, &msg) != nil {
					continue
				}
				switch msg.Type {
				case "resize":
					if msg.Cols > 0 && msg.Rows > 0 {
						err := a.svc.Resize(ctx, c, id, pid, agentproto.PTYSize{Cols: msg.Cols, Rows: msg.Rows})
						switch {
						case err == nil:
							// At debug level: a resize that did not show (a
							// rare e2e failure, TestPTY) can be told apart
							// from one that never arrived.
							a.log.Debug("pty resized", "sandbox", id, "pid", pid, "cols", msg.Cols, "rows", msg.Rows)
						case ctx.Err() == nil:
							a.log.Warn("pty resize", "sandbox", id, "pid", pid, "err", err)
						}
					}
				case "input":
					_ = a.svc.Stdin(ctx, c, id, pid, strings.NewReader(msg.Data), false)
				}
			}
		}
	}()

	// Terminal → client.
	for {
		e, err := ev.Next()
		if errors.Is(err, io.EOF) || err != nil {
			conn.Close(websocket.StatusNormalClosure, "")
			return
		}
		switch e.Type {
		case agentproto.EventStdout, agentproto.EventStderr:
			if err := conn.Write(ctx, websocket.MessageBinary, e.Data); err != nil {
				return
			}
		case agentproto.EventExit:
			code := -1
			if e.ExitCode != nil {
				code = *e.ExitCode
			}
			msg, _ := json.Marshal(map[string]any{"type": "exit", "exit_code": code})
			_ = conn.Write(ctx, websocket.MessageText, msg)
			conn.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}

// headerHasToken reports whether a comma-separated header lists token
// (case-insensitively), as Connection and Upgrade do.
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
