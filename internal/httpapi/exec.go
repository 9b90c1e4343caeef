package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// execRequest is the body of POST /v1/sandboxes/{id}/exec. cmd is an argv
// array or a shell string.
type execRequest struct {
	Cmd        json.RawMessage   `json:"cmd"`
	Env        map[string]string `json:"env"`
	Cwd        string            `json:"cwd"`
	User       string            `json:"user"`
	Stdin      *string           `json:"stdin"`
	OpenStdin  bool              `json:"open_stdin"`
	TimeoutS   int               `json:"timeout_s"`
	Background bool              `json:"background"`
}

func (e execRequest) toService() (sandbox.ExecRequest, error) {
	out := sandbox.ExecRequest{Env: e.Env, Cwd: e.Cwd, User: e.User, TimeoutS: e.TimeoutS, Background: e.Background, OpenStdin: e.OpenStdin}
	if e.Stdin != nil {
		out.Stdin = []byte(*e.Stdin)
	}
	cmd := bytes.TrimSpace(e.Cmd)
	switch {
	case len(cmd) == 0:
		return out, errdefs.InvalidArgument("cmd: required")
	case cmd[0] == '"':
		if err := json.Unmarshal(cmd, &out.Shell); err != nil {
			return out, errdefs.InvalidArgument("cmd: %v", err)
		}
	case cmd[0] == '[':
		if err := json.Unmarshal(cmd, &out.Cmd); err != nil {
			return out, errdefs.InvalidArgument("cmd: must be an array of strings or a string")
		}
	default:
		return out, errdefs.InvalidArgument("cmd: must be an array of strings or a string")
	}
	return out, nil
}

// maxBuffered caps what a non-streaming exec collects per stream;
// maxBufferedAll caps what all of them hold at once in this server, so a
// few tenants printing a lot cannot take its memory (past it, output is
// dropped and the result says truncated). SSE execs hold nothing.
const (
	maxBuffered    = 64 << 20
	maxBufferedAll = 256 << 20
)

// bufferedAll is what non-streaming execs hold now.
var bufferedAll atomic.Int64

func (a *API) exec(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var body execRequest
	if err := decode(r, &body); err != nil {
		a.writeError(w, r, err)
		return
	}
	req, err := body.toService()
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	if req.Background {
		pid, err := a.svc.Exec(r.Context(), c, id, req)
		if err != nil {
			a.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]int{"pid": pid})
		return
	}
	// Start and follow in one round trip to the agent.
	pid, ev, err := a.svc.Run(r.Context(), c, id, req)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	defer ev.Close()
	if wantsSSE(r) {
		a.writeSSE(w, r, ev)
		return
	}
	a.collect(w, r, pid, ev)
}

func wantsSSE(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// collect answers a non-streaming exec with one JSON object.
func (a *API) collect(w http.ResponseWriter, r *http.Request, pid int, ev sandbox.EventStream) {
	// Output is kept as the chunks it came in (copies of exactly their
	// size: no buffer doubling as it grows).
	var stdout, stderr chunks
	var held int64
	defer func() { bufferedAll.Add(-held) }()
	res := execResult{PID: pid, ExitCode: -1}
	for {
		e, err := ev.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			a.writeError(w, r, err)
			return
		}
		switch e.Type {
		case agentproto.EventStdout, agentproto.EventStderr:
			buf := &stdout
			if e.Type == agentproto.EventStderr {
				buf = &stderr
			}
			n := int64(len(e.Data))
			if buf.size+n > maxBuffered || bufferedAll.Add(n) > maxBufferedAll {
				if buf.size+n <= maxBuffered {
					bufferedAll.Add(-n)
				}
				res.Truncated = true
				ev.Recycle(e.Data)
				continue
			}
			held += n
			buf.add(e.Data)
			ev.Recycle(e.Data)
		case agentproto.EventExit:
			if e.ExitCode != nil {
				res.ExitCode = *e.ExitCode
			}
			res.Signal, res.Error = e.Signal, e.Error
		}
	}
	res.CommandID = sandbox.CommandID(ev)
	res.write(w, &stdout, &stderr)
}

// chunks is output as it arrived.
type chunks struct {
	list [][]byte
	size int64
}

func (c *chunks) add(b []byte) {
	c.list = append(c.list, bytes.Clone(b))
	c.size += int64(len(b))
}

// textual reports whether the output goes out as JSON text rather than
// base64, the rule SSE output events apply per chunk, over the chunks
// joined (a rune may be split between two): valid UTF-8 and at most a
// quarter control bytes other than tab, CR, LF and ESC.
func (c *chunks) textual() bool {
	var carry []byte
	ctl := int64(0)
	for _, b := range c.list {
		if len(carry) > 0 {
			b = append(carry, b...)
		}
		end := runeStartBefore(b, len(b))
		if !utf8.Valid(b[:end]) {
			return false
		}
		carry = append([]byte(nil), b[end:]...)
		ctl += int64(controlBytes(b[:end]))
	}
	return len(carry) == 0 && ctl <= c.size/4
}

// runeStartBefore is the largest index ≤ n where no UTF-8 sequence of b
// is cut: n itself unless the last one to three bytes before it start an
// incomplete rune.
func runeStartBefore(b []byte, n int) int {
	for i := n - 1; i >= 0 && i >= n-3; i-- {
		if b[i]&0xC0 != 0x80 { // a rune's first byte
			if utf8.FullRune(b[i:n]) {
				return n
			}
			return i
		}
	}
	return n
}

// execResult is the answer of a non-streaming exec.
type execResult struct {
	PID       int
	CommandID int64 // with snapshot_on_exec (sandbox.CommandID)
	ExitCode  int
	Signal    string
	Error     string
	Truncated bool
}

// write sends the result as JSON: {pid, exit_code, signal?, error?,
// stdout, stderr, stdout_b64?, stderr_b64?, truncated?}, each stream as
// text when it is (the rule SSE output events apply) and base64 otherwise.
// The output is encoded straight to w, a piece at a time, never copied
// whole (64 MiB of output used to take ~600 MB of the server's memory).
func (res execResult) write(w http.ResponseWriter, stdout, stderr *chunks) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	b := make([]byte, 0, 64<<10)
	b = append(b, `{"pid":`...)
	b = strconv.AppendInt(b, int64(res.PID), 10)
	b = append(b, `,"exit_code":`...)
	b = strconv.AppendInt(b, int64(res.ExitCode), 10)
	if res.CommandID != 0 {
		b = append(b, `,"command_id":`...)
		b = strconv.AppendInt(b, res.CommandID, 10)
	}
	if res.Signal != "" {
		b = append(b, `,"signal":`...)
		b = strconv.AppendQuote(b, res.Signal)
	}
	if res.Error != "" {
		b = append(b, `,"error":`...)
		b = strconv.AppendQuote(b, res.Error)
	}
	streams := [2]*chunks{stdout, stderr}
	text := [2]bool{stdout.textual(), stderr.textual()}
	for k, name := range [2]string{"stdout", "stderr"} {
		b = append(b, `,"`+name+`":"`...)
		if text[k] {
			// A chunk's unfinished rune goes with the next one, so U+2028
			// is escaped whole (as encoding/json does).
			var carry []byte
			for _, data := range streams[k].list {
				if len(carry) > 0 {
					data = append(carry, data...)
				}
				end := runeStartBefore(data, len(data))
				b = appendJSONTextAll(b, data[:end])
				carry = append(carry[:0:0], data[end:]...)
				_, _ = w.Write(b)
				b = b[:0]
			}
		}
		b = append(b, '"')
	}
	for k, name := range [2]string{"stdout_b64", "stderr_b64"} {
		if text[k] || streams[k].size == 0 {
			continue
		}
		b = append(b, `,"`+name+`":"`...)
		_, _ = w.Write(b)
		b = b[:0]
		enc := base64.NewEncoder(base64.StdEncoding, w)
		for _, data := range streams[k].list {
			_, _ = enc.Write(data)
		}
		_ = enc.Close()
		b = append(b, '"')
	}
	if res.Truncated {
		b = append(b, `,"truncated":true`...)
	}
	b = append(b, "}\n"...)
	_, _ = w.Write(b)
}

// streamEvents writes a process's events as server-sent events, each with
// its seq as id, until the process exits (or, without follow, until the
// buffered events are written).
func (a *API) streamEvents(w http.ResponseWriter, r *http.Request, c sandbox.Caller, id string, pid int, from uint64, follow bool) {
	ev, err := a.svc.Events(r.Context(), c, id, pid, from, follow)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	defer ev.Close()
	a.writeSSE(w, r, ev)
}

// writeSSE writes ev as server-sent events until its end.
func (a *API) writeSSE(w http.ResponseWriter, r *http.Request, ev sandbox.EventStream) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()

	type item struct {
		e   agentproto.Event
		err error
	}
	ch := make(chan item, 64)
	// done releases the reader when this writer returns (the client left):
	// it held the agent stream and up to its window of output otherwise.
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(ch)
		for {
			e, err := ev.Next()
			select {
			case ch <- item{e, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	var out []byte
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keepalive.C:
			io.WriteString(w, ": keepalive\n\n")
			_ = rc.Flush()
		case it, ok := <-ch:
			// Coalesce whatever is already queued into one write and one
			// flush: fast producers cost one syscall per batch, not per
			// event.
			out = out[:0]
			for {
				if !ok || errors.Is(it.err, io.EOF) {
					w.Write(out)
					_ = rc.Flush()
					return
				}
				if it.err != nil {
					b, _ := errorBody(it.err)
					var eb bytes.Buffer
					writeSSE(&eb, "", "error", b)
					w.Write(append(out, eb.Bytes()...))
					_ = rc.Flush()
					return
				}
				// Next set the command's id before it handed on the exit
				// (the channel orders the two).
				out = appendEventCmd(out, it.e, sandbox.CommandID(ev))
				ev.Recycle(it.e.Data) // encoded into out: the stream may reuse it
				if len(out) >= 256<<10 {
					break
				}
				select {
				case it, ok = <-ch:
					continue
				default:
				}
				break
			}
			if _, err := w.Write(out); err != nil {
				return
			}
			_ = rc.Flush()
			if cap(out) > 4<<20 {
				out = nil // one huge chunk does not pin its buffer for the stream's life
			}
		}
	}
}

// appendEvent appends one agent event in the API's SSE shape.
func appendEvent(dst []byte, e agentproto.Event) []byte { return appendEventCmd(dst, e, 0) }

// appendEventCmd is appendEvent with the command's id on its exit event
// (0: none).
func appendEventCmd(dst []byte, e agentproto.Event, cmdID int64) []byte {
	if e.Type == agentproto.EventStdout || e.Type == agentproto.EventStderr {
		return appendOutputEvent(dst, e)
	}
	var buf bytes.Buffer
	id := strconv.FormatUint(e.Seq, 10)
	switch e.Type {
	case agentproto.EventStart:
		writeSSE(&buf, id, "start", map[string]int{"pid": e.PID})
	case agentproto.EventExit:
		code := -1
		if e.ExitCode != nil {
			code = *e.ExitCode
		}
		writeSSE(&buf, id, "exit", struct {
			ExitCode  int    `json:"exit_code"`
			Signal    string `json:"signal,omitempty"`
			Error     string `json:"error,omitempty"`
			CommandID int64  `json:"command_id,omitempty"`
		}{code, e.Signal, e.Error, cmdID})
	case agentproto.EventTruncated:
		// No id: its seq is the next event's (the first kept), and a
		// client resuming after it (Last-Event-ID) would skip that one.
		writeSSE(&buf, "", "truncated", map[string]uint64{"first_seq": e.Seq})
	}
	return append(dst, buf.Bytes()...)
}

func writeSSE(buf *bytes.Buffer, id, event string, v any) {
	if id != "" {
		fmt.Fprintf(buf, "id: %s\n", id)
	}
	fmt.Fprintf(buf, "event: %s\ndata: ", event)
	enc := json.NewEncoder(buf) // one line: JSON never contains a raw newline
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	buf.WriteString("\n")
}

func pidOf(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return 0, errdefs.InvalidArgument("pid: must be a positive integer")
	}
	return pid, nil
}

func (a *API) events(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	pid, err := pidOf(r)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	from := uint64(1)
	if s := r.Header.Get("Last-Event-ID"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == math.MaxUint64 {
			a.writeError(w, r, errdefs.InvalidArgument("Last-Event-ID: must be an event id"))
			return
		}
		from = n + 1
	}
	if s := r.URL.Query().Get("from"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			a.writeError(w, r, errdefs.InvalidArgument("from: must be a positive event id"))
			return
		}
		from = n
	}
	follow := r.URL.Query().Get("follow") != "false"
	a.streamEvents(w, r, c, r.PathValue("id"), pid, from, follow)
}

func (a *API) processes(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	ps, err := a.svc.Processes(r.Context(), c, r.PathValue("id"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if ps == nil {
		ps = []agentproto.Process{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": ps})
}

// commands lists the commands started in a sandbox, oldest first, a page
// at a time (?limit=, default 100; ?cursor= the page before's next_cursor),
// also after the sandbox stopped.
func (a *API) commands(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	q := r.URL.Query()
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil {
			a.writeError(w, r, errdefs.InvalidArgument("limit: between 1 and %d", sandbox.MaxCommandsPage))
			return
		}
		limit = n
	}
	cmds, next, err := a.svc.Commands(r.Context(), c, r.PathValue("id"), q.Get("cursor"), limit)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Commands   []sandbox.Command `json:"commands"`
		NextCursor string            `json:"next_cursor,omitempty"`
	}{cmds, next})
}

func (a *API) stdin(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	pid, err := pidOf(r)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	eof := r.URL.Query().Get("eof") == "true"
	if err := a.svc.Stdin(r.Context(), c, r.PathValue("id"), pid, r.Body, eof); err != nil {
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *API) signal(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	pid, err := pidOf(r)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	var req struct {
		Signal string `json:"signal"`
	}
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	if err := a.svc.Signal(r.Context(), c, r.PathValue("id"), pid, req.Signal); err != nil {
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
