package sandbox

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// ExecRequest runs a command in a sandbox. Exactly one of Cmd (argv) and
// Shell is set.
type ExecRequest struct {
	Cmd        []string
	Shell      string
	Env        map[string]string
	Cwd        string
	User       string
	Stdin      []byte
	OpenStdin  bool // keep stdin open for later writes
	TimeoutS   int
	Background bool
	PTY        *agentproto.PTYSize
	// Tag is a label the agent keeps with the process and lists with it,
	// so it outlives the server (the E2B facade's process tags and code
	// contexts are found by it after a restart or in a fork).
	Tag string
	// FollowIdentity: the process applies the sandbox's env to itself
	// when a copy of it gets a new identity (agentproto.StartRequest.
	// FollowInit; needs OpenStdin). Not part of the API.
	FollowIdentity bool
}

// validUser checks a user name a request runs or writes as ("" is the
// sandbox's default user).
func validUser(u string) error {
	if u != "" && !nameRE.MatchString(u) {
		return errdefs.InvalidArgument("user: invalid name %q", u)
	}
	return nil
}

// maxTagBytes bounds a process tag.
const maxTagBytes = 1024

const maxArgBytes = 1 << 20

func (r *ExecRequest) validate() error {
	if (len(r.Cmd) == 0) == (r.Shell == "") {
		return errdefs.InvalidArgument("cmd: give an argv array or a shell string")
	}
	n := len(r.Shell)
	for _, a := range r.Cmd {
		n += len(a)
		if containsNUL(a) {
			return errdefs.InvalidArgument("cmd: NUL byte in argument")
		}
	}
	if len(r.Cmd) > 0 && r.Cmd[0] == "" {
		return errdefs.InvalidArgument("cmd: empty program name")
	}
	if n > maxArgBytes || containsNUL(r.Shell) {
		return errdefs.InvalidArgument("cmd: too long or contains NUL")
	}
	if err := validateEnv(r.Env); err != nil {
		return err
	}
	if r.TimeoutS < 0 || r.TimeoutS > 86400 {
		return errdefs.InvalidArgument("timeout_s: must be between 0 and 86400")
	}
	if err := validUser(r.User); err != nil {
		return err
	}
	if r.Cwd != "" {
		if _, err := cleanPath(r.Cwd); err != nil {
			return err
		}
	}
	if len(r.Tag) > maxTagBytes || !utf8.ValidString(r.Tag) || strings.ContainsFunc(r.Tag, unicode.IsControl) {
		return errdefs.InvalidArgument("tag: at most %d bytes of printable UTF-8", maxTagBytes)
	}
	return nil
}

// Exec starts a process and returns its pid. The process's output is
// buffered in the guest agent; read it with Events.
func (s *Service) Exec(ctx context.Context, c Caller, id string, req ExecRequest) (int, error) {
	sb, l, err := s.execTarget(ctx, c, id, req)
	if err != nil {
		return 0, err
	}
	s.baselineBeforeExec(ctx, sb, l)
	start := s.now()
	pid, err := l.agent.Start(ctx, req.agentRequest())
	if err != nil {
		return 0, err
	}
	s.started(sb, pid, req, start)
	return pid, nil
}

// Run starts a process and follows its events from the first, in one
// round trip to the agent (Exec then Events in one).
func (s *Service) Run(ctx context.Context, c Caller, id string, req ExecRequest) (int, EventStream, error) {
	sb, l, err := s.execTarget(ctx, c, id, req)
	if err != nil {
		return 0, nil, err
	}
	s.baselineBeforeExec(ctx, sb, l)
	if err := l.openStream(); err != nil {
		return 0, nil, err
	}
	start := s.now()
	pid, ev, err := l.agent.Run(ctx, req.agentRequest())
	if err != nil {
		l.streams.Add(-1)
		return 0, nil, err
	}
	s.started(sb, pid, req, start)
	return pid, &recordingStream{EventStream: ev, s: s, l: l, id: id, pid: pid, onExec: s.snapshotOnExec(sb)}, nil
}

// maxStreams bounds the output streams open on one sandbox at once: each
// holds an agent stream and up to its flow-control window (4 MiB) of
// output in the server, and 1,000 slow readers took the server past 4 GB.
const maxStreams = 128

// openStream counts a stream in, or refuses it past maxStreams.
func (l *live) openStream() error {
	if l.streams.Add(1) > maxStreams {
		l.streams.Add(-1)
		return errdefs.Unavailable("%d output streams are open on this sandbox, the most at once; close one first", maxStreams)
	}
	return nil
}

func (s *Service) execTarget(ctx context.Context, c Caller, id string, req ExecRequest) (store.Sandbox, *live, error) {
	if err := req.validate(); err != nil {
		return store.Sandbox{}, nil, err
	}
	return s.liveRunning(ctx, c, id)
}

func (r ExecRequest) agentRequest() agentproto.StartRequest {
	return agentproto.StartRequest{
		Cmd: r.Cmd, Shell: r.Shell, Env: r.Env, Cwd: r.Cwd, User: r.User,
		Stdin: r.OpenStdin || r.PTY != nil, StdinData: r.Stdin,
		TimeoutMS: int64(r.TimeoutS) * 1000, PTY: r.PTY, Tag: r.Tag, FollowInit: r.FollowIdentity,
	}
}

// started observes the start latency and logs the process in the history.
func (s *Service) started(sb store.Sandbox, pid int, req ExecRequest, start time.Time) {
	s.metrics.ExecLatency.WithLabelValues(sb.Driver).Observe(s.now().Sub(start).Seconds())
	s.procs.add(store.ProcessOp{Start: &store.Process{SandboxID: sb.ID, PID: pid, Cmd: req.recordedCmd(), Tag: req.Tag, Background: req.Background, StartedAt: start.UTC()}})
}

// recordedCmd is the command the history keeps of r: capped here already
// (store.CapCmd), so the process log's backlog (up to maxProcLogBacklog
// ops) never holds whole commands of up to maxArgBytes each.
func (r ExecRequest) recordedCmd() []string {
	cmd := r.Cmd
	if r.Shell != "" {
		cmd = []string{"/bin/bash", "-lc", r.Shell}
	}
	return store.CapCmd(cmd)
}

// EventStream is a process's event stream.
type EventStream interface {
	// Next returns the next event, io.EOF after the last.
	Next() (agentproto.Event, error)
	// Recycle hands back an event's Data once the caller is done with it,
	// so later output is read into it (optional: a caller that keeps Data
	// does not call it).
	Recycle([]byte)
	Close() error
}

// Events streams a process's events from seq from (1 = the beginning).
// The exit, when the stream sees it, is recorded in the store.
func (s *Service) Events(ctx context.Context, c Caller, id string, pid int, from uint64, follow bool) (EventStream, error) {
	sb, l, err := s.liveRunning(ctx, c, id)
	if err != nil {
		return nil, err
	}
	if err := l.openStream(); err != nil {
		return nil, err
	}
	ev, err := l.agent.Events(ctx, pid, from, follow)
	if err != nil {
		l.streams.Add(-1)
		return nil, err
	}
	return &recordingStream{EventStream: ev, s: s, l: l, id: id, pid: pid, onExec: s.snapshotOnExec(sb)}, nil
}

type recordingStream struct {
	EventStream
	s      *Service
	l      *live
	id     string
	pid    int
	onExec bool  // snapshot after the exit (snapshot_on_exec), before handing it on
	cmdID  int64 // the command's id, once onExec's snapshot looked it up
	closed atomic.Bool
}

func (r *recordingStream) Close() error {
	if r.closed.CompareAndSwap(false, true) {
		r.l.streams.Add(-1)
	}
	return r.EventStream.Close()
}

func (r *recordingStream) Next() (agentproto.Event, error) {
	e, err := r.EventStream.Next()
	if err == nil && e.Type == agentproto.EventExit {
		code := -1
		if e.ExitCode != nil {
			code = *e.ExitCode
		}
		r.s.procs.add(store.ProcessOp{Exit: &store.ProcessExit{SandboxID: r.id, PID: r.pid, ExitCode: code, ExitedAt: e.Time.UTC()}})
		if r.onExec {
			r.cmdID = r.s.snapshotAfterExec(context.Background(), r.id, r.pid)
		}
	}
	return e, err
}

// Processes lists the processes started in the sandbox.
func (s *Service) Processes(ctx context.Context, c Caller, id string) ([]agentproto.Process, error) {
	_, l, err := s.liveRunning(ctx, c, id)
	if err != nil {
		return nil, err
	}
	return l.agent.Processes(ctx)
}

// Stdin writes to a process's stdin.
func (s *Service) Stdin(ctx context.Context, c Caller, id string, pid int, r io.Reader, eof bool) error {
	_, l, err := s.liveRunning(ctx, c, id)
	if err != nil {
		return err
	}
	return l.agent.Stdin(ctx, pid, r, eof)
}

// Signal sends a signal to a process's group.
func (s *Service) Signal(ctx context.Context, c Caller, id string, pid int, sig string) error {
	if sig == "" || len(sig) > 16 {
		return errdefs.InvalidArgument("signal: required, e.g. SIGTERM")
	}
	_, l, err := s.liveRunning(ctx, c, id)
	if err != nil {
		return err
	}
	return l.agent.Signal(ctx, pid, sig)
}

// Resize resizes a PTY process's terminal.
func (s *Service) Resize(ctx context.Context, c Caller, id string, pid int, size agentproto.PTYSize) error {
	_, l, err := s.liveRunning(ctx, c, id)
	if err != nil {
		return err
	}
	return l.agent.Resize(ctx, pid, size)
}

// Agent returns the agent client of a running sandbox (for the file
// operations in files.go and for facades that need the raw agent).
func (s *Service) agentFor(ctx context.Context, c Caller, id string) (*agentclient.Client, error) {
	_, l, err := s.liveRunning(ctx, c, id)
	if err != nil {
		return nil, err
	}
	return l.agent, nil
}
