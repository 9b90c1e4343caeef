package agentclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

func procPath(pattern string, pid int) string {
	return strings.Replace(pattern, "{pid}", strconv.Itoa(pid), 1)
}

// Info returns the agent's version and guest details.
func (c *Client) Info(ctx context.Context) (agentproto.Info, error) {
	var info agentproto.Info
	err := c.call(ctx, request{method: http.MethodGet, path: agentproto.PathInfo}, &info)
	return info, err
}

// Init gives the sandbox its identity (environment, hostname, clock, entropy).
func (c *Client) Init(ctx context.Context, req agentproto.InitRequest) error {
	return c.call(ctx, request{method: http.MethodPost, path: agentproto.PathInit, json: req}, nil)
}

// Start starts a process and returns its pid. Its output is buffered in
// the agent until read with Events. Errors: ErrInvalidArgument (bad
// request, unknown user), ErrNotFound (executable not found).
func (c *Client) Start(ctx context.Context, req agentproto.StartRequest) (int, error) {
	var resp agentproto.StartResponse
	err := c.call(ctx, request{method: http.MethodPost, path: agentproto.PathProcesses, json: req}, &resp)
	return resp.PID, err
}

// Run starts a process and follows its events on the same stream: one
// round trip instead of Start then Events. Errors as Start.
func (c *Client) Run(ctx context.Context, req agentproto.StartRequest) (int, *EventStream, error) {
	resp, err := c.do(ctx, request{method: http.MethodPost, path: agentproto.PathProcesses, json: req,
		query: url.Values{"follow": {"1"}}, accept: agentproto.EventFramesType})
	if err != nil {
		return 0, nil, err
	}
	ct := resp.Header.Get("Content-Type")
	if strings.HasPrefix(ct, agentproto.EventFramesType) {
		pid, err := strconv.Atoi(resp.Header.Get(agentproto.HeaderPID))
		if err != nil || pid <= 0 {
			resp.Body.Close()
			return 0, nil, transportError(ctx, fmt.Errorf("run: no pid in the answer"))
		}
		s := newEventStream(ctx, resp, true)
		s.c, s.pid = c, pid
		return pid, s, nil
	}
	lines := bufio.NewReaderSize(resp.Body, 256<<10)
	var sr agentproto.StartResponse
	if err := decodeLine(lines, MaxUnaryAnswer, "POST "+agentproto.PathProcesses, &sr); err != nil {
		resp.Body.Close()
		if errors.Is(err, errdefs.ErrTooLarge) {
			return 0, nil, err
		}
		return 0, nil, transportError(ctx, err)
	}
	if !strings.HasPrefix(ct, "application/x-ndjson") {
		// An agent older than Run (a sandbox started before an upgrade)
		// only started the process: follow it the old way.
		resp.Body.Close()
		ev, err := c.Events(ctx, sr.PID, 1, true)
		return sr.PID, ev, err
	}
	return sr.PID, &EventStream{ctx: ctx, body: resp.Body, lines: lines, follow: true, c: c, pid: sr.PID, nextSeq: 1}, nil
}

// Events streams a process's events from seq from (1 = from the start).
// With follow the stream ends after the exit event; without, after what is
// buffered. Errors: ErrNotFound for an unknown pid.
func (c *Client) Events(ctx context.Context, pid int, from uint64, follow bool) (*EventStream, error) {
	q := url.Values{"from": {strconv.FormatUint(from, 10)}}
	if !follow {
		q.Set("follow", "0")
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: procPath(agentproto.PathEvents, pid), query: q, accept: agentproto.EventFramesType})
	if err != nil {
		return nil, err
	}
	es := newEventStream(ctx, resp, follow)
	es.c, es.pid, es.nextSeq = c, pid, from
	return es, nil
}

// frameReaders are the read buffers of event streams in binary frames,
// taken back when a stream reads its exit event. Large, for output
// streams; an exec's stream is short, and a new one per exec was more than
// half of what an exec allocated (BenchmarkExecTrue: 447 KB per exec).
var frameReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 256<<10) }}

// newEventStream reads resp's events in the format the agent chose:
// binary frames, or NDJSON from an agent that does not know them.
func newEventStream(ctx context.Context, resp *http.Response, follow bool) *EventStream {
	s := &EventStream{ctx: ctx, body: resp.Body, follow: follow, free: make(chan []byte, 4), nextSeq: 1}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), agentproto.EventFramesType) {
		br := frameReaders.Get().(*bufio.Reader)
		br.Reset(resp.Body)
		s.frames = br
	} else {
		s.lines = bufio.NewReaderSize(resp.Body, 256<<10)
	}
	return s
}

// releaseFrames gives a stream's frame reader back after the exit event:
// nothing reads it after that (read answers io.EOF, nothing re-attaches,
// and Close closes only the body). Only read calls it, and only one
// goroutine reads a stream.
func (s *EventStream) releaseFrames(br *bufio.Reader) {
	s.mu.Lock()
	if s.frames != br {
		s.mu.Unlock()
		return
	}
	s.frames = nil
	s.mu.Unlock()
	br.Reset(nil)
	frameReaders.Put(br)
}

// EventStream is an open event stream; Close it when done.
//
// A following stream outlives its session: when the session breaks before
// the exit event (a checkpoint, a fork and a pause with checkpoint drop the
// agent's connection; the process runs on), Next re-attaches from the event
// after the last one it returned, for up to ReattachWithin, so the caller
// sees every event once.
type EventStream struct {
	ctx     context.Context
	c       *Client // to re-attach (nil: not possible)
	pid     int
	nextSeq uint64 // seq after the last event returned
	follow  bool
	exited  bool
	free    chan []byte // output buffers handed back by Recycle

	mu     sync.Mutex // body, lines and frames change on a re-attach
	body   io.ReadCloser
	lines  *bufio.Reader // NDJSON (older agents), lines of at most MaxEventLine
	frames *bufio.Reader // binary frames (agentproto.EventFramesType)
	closed bool
}

// ReattachWithin bounds how long a following stream tries to re-attach
// after its session broke (an agent reconnects within milliseconds of a
// checkpoint; a paused sandbox does not until it is resumed).
var ReattachWithin = 30 * time.Second

// Recycle hands back the Data of an event this stream returned, once the
// caller is done with it: later output frames are read into it instead of
// a new buffer. Optional; a caller that keeps Data simply does not call it.
func (s *EventStream) Recycle(b []byte) {
	if cap(b) == 0 {
		return
	}
	select {
	case s.free <- b:
	default: // enough kept; let this one go
	}
}

// Next returns the next event, io.EOF after the last one. A following
// stream cut before the exit event re-attaches (see EventStream); when that
// fails it returns ErrUnavailable.
func (s *EventStream) Next() (agentproto.Event, error) {
	ev, err := s.read()
	if err == nil || !s.follow || s.c == nil || s.pid <= 0 || !errors.Is(err, errdefs.ErrUnavailable) {
		return ev, err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ev, err
	}
	deadline := time.Now().Add(ReattachWithin)
	wait := 10 * time.Millisecond
	for s.ctx.Err() == nil && time.Now().Before(deadline) {
		ok, rerr := s.reattach()
		if ok {
			if ev, rerr := s.read(); !errors.Is(rerr, errdefs.ErrUnavailable) {
				return ev, rerr
			}
		} else if !errors.Is(rerr, errdefs.ErrUnavailable) {
			return ev, err // the process is gone, or the stream closed: no use trying
		}
		select {
		case <-time.After(wait):
		case <-s.ctx.Done():
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
	return ev, err
}

// read returns the next event of the current session's stream.
func (s *EventStream) read() (agentproto.Event, error) {
	var ev agentproto.Event
	if s.exited {
		return ev, io.EOF
	}
	s.mu.Lock()
	frames, lines := s.frames, s.lines
	s.mu.Unlock()
	var err error
	if frames != nil {
		var buf []byte
		select {
		case buf = <-s.free:
		default:
		}
		ev, err = agentproto.ReadEventFrameLimit(frames, buf, MaxEventFrame)
	} else {
		err = decodeLine(lines, MaxEventLine, "an event stream", &ev)
	}
	if errors.Is(err, agentproto.ErrFrameTooLarge) {
		err = tooLarge("an event stream", MaxEventFrame, "bytes in one event")
	}
	if errors.Is(err, errdefs.ErrTooLarge) {
		return ev, err // not a broken session: no re-attach
	}
	if err != nil {
		if errors.Is(err, io.EOF) && !s.follow {
			return ev, io.EOF
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return ev, transportError(s.ctx, err)
	}
	s.nextSeq = ev.Seq + 1
	if ev.Type == agentproto.EventTruncated {
		// Its seq is the first event kept, which comes next: a stream
		// re-attached now must ask for it, not for the one after.
		s.nextSeq = ev.Seq
	}
	if ev.Type == agentproto.EventExit {
		s.exited = true
		if frames != nil {
			s.releaseFrames(frames)
		}
	}
	return ev, nil
}

// reattach replaces the broken session's stream with a new one from
// nextSeq; an ErrUnavailable error means "not yet".
func (s *EventStream) reattach() (bool, error) {
	ns, err := s.c.Events(s.ctx, s.pid, s.nextSeq, true)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		ns.body.Close()
		return false, errdefs.Conflict("stream closed")
	}
	s.body.Close()
	s.body, s.lines, s.frames = ns.body, ns.lines, ns.frames
	return true, nil
}

// Close releases the stream (the agent forgets the subscriber).
func (s *EventStream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.body.Close()
	}
	return nil
}

// Stdin writes r to the process's stdin; eof closes it afterwards (sends
// ^D on a PTY). Errors: ErrConflict when stdin is closed.
func (c *Client) Stdin(ctx context.Context, pid int, r io.Reader, eof bool) error {
	var q url.Values
	if eof {
		q = url.Values{"eof": {"1"}}
	}
	if r == nil {
		r = http.NoBody
	}
	return c.call(ctx, request{method: http.MethodPost, path: procPath(agentproto.PathStdin, pid), query: q, body: r}, nil)
}

// Signal sends sig ("SIGTERM", "TERM", "9", …) to the process's group.
// Errors: ErrConflict when the process is no longer running.
func (c *Client) Signal(ctx context.Context, pid int, sig string) error {
	return c.call(ctx, request{method: http.MethodPost, path: procPath(agentproto.PathSignal, pid), json: agentproto.SignalRequest{Signal: sig}}, nil)
}

// Reclaim asks the agent to kill the process using the most memory (the
// sandbox reached its memory limit).
func (c *Client) Reclaim(ctx context.Context) (agentproto.ReclaimResponse, error) {
	var out agentproto.ReclaimResponse
	err := c.call(ctx, request{method: http.MethodPost, path: agentproto.PathReclaim}, &out)
	return out, err
}

// Warmup has the agent run what a first command pays for once (see the
// agent's handleWarmup): for sandboxes started ahead of demand.
func (c *Client) Warmup(ctx context.Context) error {
	return c.call(ctx, request{method: http.MethodPost, path: agentproto.PathWarmup}, nil)
}

// Resize resizes a PTY process's terminal.
func (c *Client) Resize(ctx context.Context, pid int, size agentproto.PTYSize) error {
	return c.call(ctx, request{method: http.MethodPost, path: procPath(agentproto.PathResize, pid), json: size}, nil)
}

// Processes lists running and recently exited processes (at most
// MaxProcesses; a longer list is errdefs.ErrTooLarge).
func (c *Client) Processes(ctx context.Context) ([]agentproto.Process, error) {
	return callList[agentproto.Process](ctx, c, request{method: http.MethodGet, path: agentproto.PathProcesses}, MaxProcesses)
}

// Process describes one process. Errors: ErrNotFound.
func (c *Client) Process(ctx context.Context, pid int) (agentproto.Process, error) {
	var out agentproto.Process
	req := request{method: http.MethodGet, path: procPath(agentproto.PathProcess, pid)}
	err := c.roundTrip(ctx, req, func(body io.Reader, what string) error {
		return decodeOne(body, MaxListEntry, what, &out)
	})
	return out, err
}

// Stats reports the guest's CPU, memory and disk use (agent protocol ≥ 3;
// an older agent answers errdefs.ErrNotFound).
func (c *Client) Stats(ctx context.Context) (agentproto.Stats, error) {
	var out agentproto.Stats
	err := c.call(ctx, request{method: http.MethodGet, path: agentproto.PathStats}, &out)
	return out, err
}

// DiskStats is Stats without the CPU use (which may take a 100 ms
// window), naming regular files larger than filesOver bytes when it is
// positive (Stats.LargeFiles; the agent walks its root filesystem).
func (c *Client) DiskStats(ctx context.Context, filesOver int64) (agentproto.Stats, error) {
	var out agentproto.Stats
	q := url.Values{"cpu": {"0"}}
	if filesOver > 0 {
		q.Set("files_over", strconv.FormatInt(filesOver, 10))
	}
	err := c.call(ctx, request{method: http.MethodGet, path: agentproto.PathStats, query: q}, &out)
	return out, err
}
