package space

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Set exactly one of
// Cmd (an argv, run without a shell) and Shell (a string run by the shell).
type ExecRequest struct {
	Cmd        []string          // argv; Cmd[0] is looked up in PATH
	Shell      string            // shell command line, e.g. "ls | wc -l"
	Env        map[string]string // added to the sandbox's environment
	Cwd        string            // working directory
	User       string            // user to run as
	Stdin      string            // written to the process's stdin, then closed
	TimeoutS   int               // kill the process after this many seconds
	Background bool              // return at once with the pid (Exec only)
}

// MarshalJSON encodes cmd as an array for Cmd and as a string for Shell.
func (r ExecRequest) MarshalJSON() ([]byte, error) {
	type wire struct {
		Cmd        any               `json:"cmd"`
		Env        map[string]string `json:"env,omitempty"`
		Cwd        string            `json:"cwd,omitempty"`
		User       string            `json:"user,omitempty"`
		Stdin      string            `json:"stdin,omitempty"`
		TimeoutS   int               `json:"timeout_s,omitempty"`
		Background bool              `json:"background,omitempty"`
	}
	w := wire{Env: r.Env, Cwd: r.Cwd, User: r.User, Stdin: r.Stdin, TimeoutS: r.TimeoutS, Background: r.Background}
	switch {
	case r.Shell != "" && len(r.Cmd) > 0:
		return nil, errors.New("space: ExecRequest has both Cmd and Shell")
	case r.Shell != "":
		w.Cmd = r.Shell
	case len(r.Cmd) > 0:
		w.Cmd = r.Cmd
	default:
		return nil, errors.New("space: ExecRequest has no command")
	}
	return json.Marshal(w)
}

// ExecResult is the outcome of a non-streamed exec. For a background exec only
// PID is set.
type ExecResult struct {
	PID int
	// CommandID is the command's id (Command.ID) in a sandbox created with
	// SnapshotOnExec (0 otherwise; the command list has it either way).
	CommandID int64
	ExitCode  int
	Signal    string // e.g. "SIGKILL" when a signal ended the process
	Error     string // e.g. "timeout", when the server reports one
	Stdout    []byte
	Stderr    []byte
	// Truncated is set when the server dropped some of the output (past
	// its per-exec or server-wide buffer): Stdout and Stderr are partial.
	Truncated bool
}

func (r *ExecResult) UnmarshalJSON(b []byte) error {
	var w struct {
		PID       int     `json:"pid"`
		CommandID int64   `json:"command_id"`
		ExitCode  int     `json:"exit_code"`
		Signal    string  `json:"signal"`
		Error     string  `json:"error"`
		Truncated bool    `json:"truncated"`
		Stdout    *string `json:"stdout"`
		Stderr    *string `json:"stderr"`
		StdoutB64 *string `json:"stdout_b64"`
		StderrB64 *string `json:"stderr_b64"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = ExecResult{PID: w.PID, CommandID: w.CommandID, ExitCode: w.ExitCode, Signal: w.Signal, Error: w.Error, Truncated: w.Truncated}
	var err error
	if r.Stdout, err = textOrB64(w.Stdout, w.StdoutB64); err != nil {
		return fmt.Errorf("stdout_b64: %w", err)
	}
	if r.Stderr, err = textOrB64(w.Stderr, w.StderrB64); err != nil {
		return fmt.Errorf("stderr_b64: %w", err)
	}
	return nil
}

func textOrB64(text, b64 *string) ([]byte, error) {
	if b64 != nil {
		return base64.StdEncoding.DecodeString(*b64)
	}
	if text != nil {
		return []byte(*text), nil
	}
	return nil, nil
}

// Exec runs a command and waits for it, returning its whole output. Use
// ExecStream for long-running commands or large output. With
// req.Background it returns at once with only PID set.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	var res ExecResult
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/sandboxes/" + seg(id) + "/exec", json: req}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream runs a command and streams its events (start, stdout, stderr,
// exit) as they happen. req.Background is ignored. Close the stream when done;
// closing early does not stop the process.
func (c *Client) ExecStream(ctx context.Context, id string, req ExecRequest) (*EventStream, error) {
	req.Background = false
	resp, err := c.send(ctx, request{
		method: http.MethodPost,
		path:   "/v1/sandboxes/" + seg(id) + "/exec",
		json:   req,
		header: http.Header{"Accept": {"text/event-stream"}},
	})
	if err != nil {
		return nil, err
	}
	return newEventStream(resp.Body), nil
}

// Events streams a process's events, replaying the buffered ones first and
// following until the process exits. afterSeq is the seq of the last event the
// caller has already seen (sent as Last-Event-ID), so reconnecting with
// EventStream.LastSeq resumes without gaps or repeats; pass a negative
// afterSeq to replay everything still buffered.
func (c *Client) Events(ctx context.Context, id string, pid int, afterSeq int64) (*EventStream, error) {
	return c.events(ctx, id, pid, afterSeq, true)
}

// BufferedEvents is Events without following: the stream ends after the
// events buffered so far.
func (c *Client) BufferedEvents(ctx context.Context, id string, pid int, afterSeq int64) (*EventStream, error) {
	return c.events(ctx, id, pid, afterSeq, false)
}

func (c *Client) events(ctx context.Context, id string, pid int, afterSeq int64, follow bool) (*EventStream, error) {
	h := http.Header{"Accept": {"text/event-stream"}}
	if afterSeq >= 0 {
		h.Set("Last-Event-ID", strconv.FormatInt(afterSeq, 10))
	}
	var q url.Values
	if !follow {
		q = url.Values{"follow": {"false"}}
	}
	resp, err := c.send(ctx, request{
		method: http.MethodGet,
		path:   fmt.Sprintf("/v1/sandboxes/%s/processes/%d/events", seg(id), pid),
		query:  q,
		header: h,
	})
	if err != nil {
		return nil, err
	}
	st := newEventStream(resp.Body)
	if afterSeq >= 0 {
		// A resumed stream that breaks before its first event resumes
		// from the same point again, not from the start.
		st.lastSeq = afterSeq
	}
	return st, nil
}

// Event types of a process's event stream.
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	// EventTruncated: events before Seq were dropped from the server's
	// buffer before they were read (Data holds {"first_seq": Seq}).
	EventTruncated = "truncated"
)

// Event is one event of a process: its start, a chunk of output, or its exit.
type Event struct {
	Seq  int64  // the process's event sequence number (the SSE id)
	Type string // EventStart, EventStdout, EventStderr, EventExit or one this SDK does not know

	PID      int    // EventStart
	Data     []byte // EventStdout/EventStderr: the chunk (data_b64 already decoded); unknown types: the raw JSON
	ExitCode int    // EventExit
	Signal   string // EventExit: e.g. "SIGKILL" when a signal ended the process
	Error    string // EventExit: e.g. "timeout"
}

// EventStream reads a process's events. It is not safe for concurrent use.
type EventStream struct {
	body    io.ReadCloser
	sse     *sseReader
	lastSeq int64
	err     error
}

func newEventStream(body io.ReadCloser) *EventStream {
	return &EventStream{body: body, sse: newSSEReader(body), lastSeq: -1}
}

// Next returns the next event. It returns io.EOF when the server ends the
// stream (after the exit event, or after the buffered events when not
// following); any other error means the stream broke and can be resumed with
// Events(…, LastSeq()).
func (s *EventStream) Next() (Event, error) {
	if s.err != nil {
		return Event{}, s.err
	}
	raw, err := s.sse.Next()
	if err != nil {
		s.err = err
		return Event{}, err
	}
	ev, err := decodeEvent(raw)
	if err != nil {
		s.err = err
		return Event{}, err
	}
	if raw.ID != "" {
		s.lastSeq = ev.Seq
	}
	return ev, nil
}

// LastSeq is the seq of the last event returned by Next (for a resumed
// stream, the afterSeq it was opened with until then), or -1.
func (s *EventStream) LastSeq() int64 { return s.lastSeq }

// Close releases the connection. The process keeps running.
func (s *EventStream) Close() error { return s.body.Close() }

func decodeEvent(raw sseEvent) (Event, error) {
	ev := Event{Type: raw.Event}
	if raw.ID != "" {
		seq, err := strconv.ParseInt(raw.ID, 10, 64)
		if err != nil {
			return Event{}, fmt.Errorf("space: event id %q is not a sequence number", raw.ID)
		}
		ev.Seq = seq
	}
	bad := func(err error) (Event, error) {
		return Event{}, fmt.Errorf("space: decode %s event: %w", raw.Event, err)
	}
	switch raw.Event {
	case EventTruncated:
		var d struct {
			First int64 `json:"first_seq"`
		}
		if err := json.Unmarshal([]byte(raw.Data), &d); err != nil {
			return bad(err)
		}
		ev.Seq, ev.Data = d.First, []byte(raw.Data)
	case EventStart:
		var d struct {
			PID int `json:"pid"`
		}
		if err := json.Unmarshal([]byte(raw.Data), &d); err != nil {
			return bad(err)
		}
		ev.PID = d.PID
	case EventStdout, EventStderr:
		if b, ok := decodeOutput(raw.Data); ok {
			ev.Data = b
			break
		}
		var d struct {
			Data    *string `json:"data"`
			DataB64 *string `json:"data_b64"`
		}
		if err := json.Unmarshal([]byte(raw.Data), &d); err != nil {
			return bad(err)
		}
		b, err := textOrB64(d.Data, d.DataB64)
		if err != nil {
			return bad(err)
		}
		ev.Data = b
	case EventExit:
		var d struct {
			ExitCode int    `json:"exit_code"`
			Signal   string `json:"signal"`
			Error    string `json:"error"`
		}
		if err := json.Unmarshal([]byte(raw.Data), &d); err != nil {
			return bad(err)
		}
		ev.ExitCode, ev.Signal, ev.Error = d.ExitCode, d.Signal, d.Error
	case "error":
		// A stream that fails after its headers were sent reports an error
		// body as an event.
		e := &APIError{}
		if json.Unmarshal([]byte(raw.Data), e) != nil || e.Code == "" {
			e = &APIError{Status: 500, Code: CodeInternal, Message: raw.Data}
		}
		return Event{}, e
	default:
		ev.Data = []byte(raw.Data)
	}
	return ev, nil
}

// Process describes one process started in a sandbox.
type Process struct {
	PID       int        `json:"pid"`
	Cmd       []string   `json:"cmd"`
	Tag       string     `json:"tag,omitempty"`
	User      string     `json:"user"`
	Cwd       string     `json:"cwd"`
	PTY       bool       `json:"pty"`
	StartedAt time.Time  `json:"started_at"`
	Running   bool       `json:"running"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Signal    string     `json:"signal,omitempty"`
	ExitedAt  *time.Time `json:"exited_at,omitempty"`
}

// Processes lists the sandbox's processes, running and recently exited.
func (c *Client) Processes(ctx context.Context, id string) ([]Process, error) {
	var out struct {
		Processes []Process `json:"processes"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes/" + seg(id) + "/processes"}, &out); err != nil {
		return nil, err
	}
	return out.Processes, nil
}

// SendStdin streams r (which may be nil) to a process's stdin and, with eof,
// closes its stdin afterwards. The body is streamed, not buffered.
func (c *Client) SendStdin(ctx context.Context, id string, pid int, r io.Reader, eof bool) error {
	var q url.Values
	if eof {
		q = url.Values{"eof": {"true"}}
	}
	if r == nil {
		r = http.NoBody
	}
	return c.do(ctx, request{
		method: http.MethodPost,
		path:   fmt.Sprintf("/v1/sandboxes/%s/processes/%d/stdin", seg(id), pid),
		query:  q,
		body:   r,
		ctype:  "application/octet-stream",
	}, nil)
}

// Signal sends a signal, by name ("SIGTERM", "SIGKILL", "SIGINT"…), to a process.
func (c *Client) Signal(ctx context.Context, id string, pid int, signal string) error {
	body := struct {
		Signal string `json:"signal"`
	}{signal}
	return c.do(ctx, request{
		method: http.MethodPost,
		path:   fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", seg(id), pid),
		json:   body,
	}, nil)
}
