package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

const (
	// Output is read in chunks that start small and double, up to
	// readChunkMax, while reads fill them: a chatty process costs little
	// memory, a bulk stream few system calls (each one costs tens of
	// microseconds inside gVisor). The first chunk is one page: most
	// commands print less, many nothing, and each exec reads stdout and
	// stderr (64 KiB chunks were most of what an exec allocated in the
	// agent; a bulk stream reaches readChunkMax after 8 full reads).
	readChunkMin = 4 << 10
	readChunkMax = 1 << 20
	// pipeSize is the capacity asked for output pipes (the default is
	// 64 KiB), so a read can take up to readChunkMax at once.
	pipeSize = readChunkMax
	// exitGrace is how long output pipes may stay open after the process
	// exited (a background grandchild holding them) before the agent stops
	// waiting for EOF and reports the exit.
	exitGrace = 500 * time.Millisecond
	// Exited processes are listed until either limit is hit.
	keepExited    = 256
	keepExitedFor = time.Hour
)

// process is one process started through the agent. Its output lives in
// log, independent of any connection to the host.
type process struct {
	pid      int
	log      *eventLog
	pty      *os.File // PTY master, nil without PTY
	timedOut atomic.Bool
	// oomKilled: killed to free memory at the sandbox's limit (reclaim).
	oomKilled atomic.Bool
	done      chan struct{} // closed after the exit event was appended

	// stdinMu guards stdin and is held for one write at a time, never
	// while a writer waits for its data: the exit closes stdin under it.
	// writeSem (one token) orders whole writes (a request's data, the
	// initial data, an identity line): one's chunks are never interleaved
	// with another's. stdinW is stdin as opened, never changed: the exit
	// sets a past write deadline on it without the lock, which ends a
	// write blocked on a pipe nobody reads (a child of the process kept
	// it), whose writer held stdinMu: the exit then waited for good and
	// the process never ended for its callers.
	stdinMu  sync.Mutex
	stdin    *os.File // write end of stdin (the PTY master with PTY); nil when closed
	stdinW   *os.File
	writeSem chan struct{}

	mu   sync.Mutex
	info agentproto.Process

	// initStdin: started with StartRequest.InitStdin and not yet through
	// an Init (guarded by Agent.mu; see prestart.go).
	initStdin bool
	// initDiscard: StartRequest.InitDiscard, removed if that Init kills it.
	initDiscard []string
	// followInit: every later identity's env goes to its stdin
	// (StartRequest.FollowInit, or a kept initStdin process; Agent.mu).
	followInit bool
}

func (p *process) snapshot() agentproto.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info
}

// start starts a process as described by req. With follow it also
// returns a subscriber reading from the first event, attached before any
// output is read, so the caller receives every byte however small the
// process's share of the output budget is.
func (a *Agent) start(req agentproto.StartRequest, follow bool) (*process, *subscriber, error) {
	if (len(req.Cmd) == 0) == (req.Shell == "") {
		return nil, nil, errdefs.InvalidArgument("exactly one of cmd and shell must be set")
	}
	if req.InitStdin && (!req.Stdin || req.PTY != nil) {
		return nil, nil, errdefs.InvalidArgument("init_stdin needs an open stdin (stdin: true) and no PTY")
	}
	if req.FollowInit && (!req.Stdin || req.PTY != nil) {
		return nil, nil, errdefs.InvalidArgument("follow_init needs an open stdin (stdin: true) and no PTY")
	}
	if len(req.InitDiscard) > 0 && !req.InitStdin {
		return nil, nil, errdefs.InvalidArgument("init_discard needs init_stdin")
	}
	for _, path := range req.InitDiscard {
		if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
			return nil, nil, errdefs.InvalidArgument("init_discard: %q is not a clean absolute path below /", path)
		}
	}
	name := req.User
	if name == "" {
		name = a.opts.User
	}
	acct, err := lookupUser(name)
	if err != nil {
		return nil, nil, err
	}
	a.mu.Lock()
	initEnv := a.initEnv
	a.mu.Unlock()
	env := buildEnv(acct, req.PTY != nil, initEnv, req.Env)

	cwd := acct.home
	if req.Cwd != "" {
		if cwd, err = a.resolve(req.Cwd); err != nil {
			return nil, nil, err
		}
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, nil, errdefs.InvalidArgument("working directory %s is not a directory", cwd)
	}
	var path string
	var argv []string
	if len(req.Cmd) > 0 {
		argv = req.Cmd
		if path, err = lookPath(req.Cmd[0], envGet(env, "PATH"), cwd); err != nil {
			return nil, nil, err
		}
	} else {
		path = "/bin/bash"
		argv = []string{path, "-lc", req.Shell}
		if executable(path) != nil {
			path = "/bin/sh"
			argv = []string{path, "-c", req.Shell}
		}
	}

	p := &process{log: newEventLog(a.opts.MaxOutput), done: make(chan struct{}), initStdin: req.InitStdin, initDiscard: req.InitDiscard, followInit: req.FollowInit}
	var sub *subscriber
	if follow {
		sub = p.log.subscribe(1)
	}
	var (
		fds       [3]int // the child's stdin, stdout and stderr
		childEnds []int  // raw descriptors closed in the agent after the fork
		tty       *os.File
		readers   []*os.File // output read ends
		kinds     []string
		fail      = func() {
			for _, fd := range childEnds {
				unix.Close(fd)
			}
			if tty != nil {
				tty.Close()
			}
			for _, f := range readers {
				f.Close()
			}
			if p.stdin != nil && p.stdin != p.pty {
				p.stdin.Close()
			}
		}
	)
	sys := &syscall.SysProcAttr{Credential: acct.credential()}
	if req.PTY != nil {
		master, t, err := openPTY()
		if err != nil {
			return nil, nil, errdefs.Newf(classOf(err), "open pty: %v", err)
		}
		_ = setWinsize(master, req.PTY.Rows, req.PTY.Cols)
		p.pty, p.stdin, tty = master, master, t
		fd := int(tty.Fd())
		fds = [3]int{fd, fd, fd}
		readers, kinds = append(readers, master), append(kinds, agentproto.EventStdout)
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		sys.Setpgid = true
		for i, kind := range []string{agentproto.EventStdout, agentproto.EventStderr} {
			r, w, err := pipe(0, pipeSize)
			if err != nil {
				fail()
				return nil, nil, errdefs.Newf(errdefs.ErrInternal, "pipe: %v", err)
			}
			readers, kinds, childEnds = append(readers, r), append(kinds, kind), append(childEnds, w)
			fds[1+i] = w
		}
		if req.Stdin || len(req.StdinData) > 0 {
			w, r, err := pipe(1, 0)
			if err != nil {
				fail()
				return nil, nil, errdefs.Newf(errdefs.ErrInternal, "pipe: %v", err)
			}
			fds[0], p.stdin = r, w
			childEnds = append(childEnds, r)
		} else {
			null, err := a.devNull()
			if err != nil {
				fail()
				return nil, nil, errdefs.Newf(errdefs.ErrInternal, "open %s: %v", os.DevNull, err)
			}
			fds[0] = null
		}
	}

	// syscall.StartProcess, not os.StartProcess: the child's descriptors
	// stay raw (an *os.File is registered with the poller and switched to
	// blocking mode for the fork, system calls that cost tens of
	// microseconds each in gVisor) and no pidfd is made; the reaper waits.
	pid, exited, err := a.reaper.start(func() (int, error) {
		pid, _, err := syscall.StartProcess(path, argv, &syscall.ProcAttr{
			Dir: cwd, Env: env, Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])}, Sys: sys,
		})
		return pid, err
	})
	for _, fd := range childEnds {
		unix.Close(fd)
	}
	childEnds = nil
	if tty != nil {
		tty.Close()
		tty = nil
	}
	if err != nil {
		fail()
		msg := fmt.Sprintf("start %s: %v", argv[0], err)
		if errors.Is(err, unix.EAGAIN) {
			msg += " (the sandbox runs as many processes and threads as its user may: " +
				"its memory sets the limit; retry when some have ended)"
		}
		return nil, nil, errdefs.Newf(classOf(err), "%s", msg)
	}

	p.pid = pid
	p.info = agentproto.Process{
		PID: pid, Cmd: slices.Clone(argv), Tag: req.Tag, User: acct.name, Cwd: cwd,
		PTY: req.PTY != nil, StartedAt: time.Now().UTC(), Running: true,
	}
	p.log.append(agentproto.Event{Type: agentproto.EventStart, PID: pid})
	a.addProcess(p)
	a.balanceOutput()

	var pumps sync.WaitGroup
	for i, r := range readers {
		pumps.Go(func() { pump(r, kinds[i], p.log) })
	}
	p.stdinW, p.writeSem = p.stdin, make(chan struct{}, 1)
	if len(req.StdinData) > 0 {
		p.writeSem <- struct{}{} // taken until the data is written, so later writes follow it
		go func() {
			defer func() { <-p.writeSem }()
			p.stdinMu.Lock()
			defer p.stdinMu.Unlock()
			if p.stdin == nil {
				return
			}
			_, _ = p.stdin.Write(req.StdinData)
			if !req.Stdin && p.pty == nil {
				p.stdin.Close()
				p.stdin = nil
			}
		}()
	}
	var timer *time.Timer
	if req.TimeoutMS > 0 {
		timer = time.AfterFunc(time.Duration(req.TimeoutMS)*time.Millisecond, func() {
			p.timedOut.Store(true)
			_ = unix.Kill(-pid, unix.SIGKILL)
		})
	}
	go func() {
		ws := <-exited
		if timer != nil {
			timer.Stop()
		}
		grace := time.Now().Add(exitGrace)
		for _, r := range readers {
			_ = r.SetReadDeadline(grace)
		}
		pumps.Wait()
		for _, r := range readers {
			if r != p.pty {
				r.Close()
			}
		}
		ev := agentproto.Event{Type: agentproto.EventExit}
		code := ws.ExitStatus()
		if ws.Signaled() {
			code = 128 + int(ws.Signal())
			ev.Signal = unix.SignalName(ws.Signal())
		}
		ev.ExitCode = &code
		if p.timedOut.Load() {
			ev.Error = "timeout"
		} else if p.oomKilled.Load() && ws.Signaled() && ws.Signal() == unix.SIGKILL {
			ev.Error = "oom"
		}
		now := time.Now().UTC()
		p.mu.Lock()
		p.info.Running, p.info.ExitCode, p.info.Signal, p.info.ExitedAt = false, &code, ev.Signal, &now
		p.mu.Unlock()
		if p.stdinW != nil {
			_ = p.stdinW.SetWriteDeadline(time.Unix(1, 0)) // ends a blocked write (see stdinW)
		}
		p.stdinMu.Lock()
		if p.stdin != nil {
			p.stdin.Close()
			p.stdin = nil
		}
		if p.pty != nil {
			p.pty.Close()
		}
		p.stdinMu.Unlock()
		p.log.append(ev)
		close(p.done)
		a.balanceOutput()
	}()
	return p, sub, nil
}

// pipe makes a pipe for a child's stdio: the agent's end (the read end
// with mine 0, the write end with mine 1) non-blocking, in the poller, as
// an *os.File; the child's end a raw blocking descriptor. Both are
// close-on-exec, so other children never inherit them. A size > 0 asks
// for that capacity, best effort (a pipe-max-size limit or an old kernel
// leaves the default).
func pipe(mine, size int) (agentEnd *os.File, childEnd int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	if size > 0 {
		_, _ = unix.FcntlInt(uintptr(p[0]), unix.F_SETPIPE_SZ, size)
	}
	// A pipe has no other status flags to keep.
	if _, err := unix.FcntlInt(uintptr(p[mine]), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, err
	}
	return os.NewFile(uintptr(p[mine]), "|"+strconv.Itoa(mine)), p[1-mine], nil
}

// pump copies one output stream into the log, one event per read, each
// read going into the rest of the current chunk. After the process exited
// and the grace deadline passed it keeps draining what is immediately
// readable and gives up at the first empty read, so an orphan holding the
// pipe cannot delay the exit event forever.
func pump(r *os.File, kind string, log *eventLog) {
	// Chunks start small and double while single reads fill them, up to
	// the log's chunk size (which shrinks with the process's share of the
	// output budget when more processes run).
	size := min(readChunkMin, log.chunkMax())
	var c *chunk
	off := 0
	defer func() { log.doneWith(c) }()
	maxSize := size
	draining := false
	var raw syscall.RawConn
	for {
		if c == nil || len(c.buf)-off < len(c.buf)/4 {
			log.doneWith(c)
			maxSize = log.chunkMax()
			size = min(size, maxSize)
			c, off = log.newChunk(size), 0
		}
		space := c.buf[off:]
		var n int
		var err error
		if !draining {
			n, err = r.Read(space)
		} else {
			rerr := raw.Read(func(fd uintptr) bool {
				for {
					n, err = unix.Read(int(fd), space)
					if err != unix.EINTR {
						return true
					}
				}
			})
			if rerr != nil || err != nil || n == 0 {
				return
			}
		}
		if n > 0 {
			if n == len(space) && size < maxSize {
				size = min(2*size, maxSize) // the next chunk takes more at once
			}
			off += n
			log.appendIn(agentproto.Event{Type: kind, Data: space[:n:n]}, c)
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && !draining {
				// The exit grace is over: read what the pipe already
				// holds, without waiting for more. The deadline goes
				// first: a raw read checks it before reading at all.
				if raw, err = r.SyscallConn(); err != nil {
					return
				}
				_ = r.SetReadDeadline(time.Time{})
				draining = true
				continue
			}
			return // EOF, or EIO from a PTY whose other side is gone
		}
	}
}

// addProcess records p and forgets old exited processes.
func (a *Agent) addProcess(p *process) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.procs[p.pid] = p
	a.pruneLocked()
}

func (a *Agent) pruneLocked() {
	var exited []*process
	cutoff := time.Now().Add(-keepExitedFor)
	for pid, p := range a.procs {
		info := p.snapshot()
		if info.Running {
			continue
		}
		if info.ExitedAt.Before(cutoff) {
			delete(a.procs, pid)
			continue
		}
		exited = append(exited, p)
	}
	if len(exited) <= keepExited {
		return
	}
	slices.SortFunc(exited, func(x, y *process) int { return x.snapshot().ExitedAt.Compare(*y.snapshot().ExitedAt) })
	for _, p := range exited[:len(exited)-keepExited] {
		delete(a.procs, p.pid)
	}
}

// balanceOutput applies the output budgets after a process started or
// exited: running processes share MaxRunningOutput equally (each at most
// MaxOutput), and exited processes keep MaxExitedOutput together, the most
// recent exits theirs and older ones what remains of it (at least their
// exit event).
func (a *Agent) balanceOutput() {
	type exit struct {
		p  *process
		at time.Time
	}
	a.mu.Lock()
	var running []*process
	var exited []exit
	for _, p := range a.procs {
		switch info := p.snapshot(); {
		case info.Running:
			running = append(running, p)
		case info.ExitedAt != nil:
			exited = append(exited, exit{p, *info.ExitedAt})
		}
	}
	a.mu.Unlock()
	share := a.opts.MaxOutput
	if len(running) > 0 {
		share = min(share, a.opts.MaxRunningOutput/len(running))
	}
	for _, p := range running {
		p.log.setLimit(share)
	}
	slices.SortFunc(exited, func(x, y exit) int { return y.at.Compare(x.at) }) // newest first
	left := a.opts.MaxExitedOutput
	for _, e := range exited {
		e.p.log.trim(left)
		left = max(0, left-e.p.log.size())
	}
}

func (a *Agent) process(pidStr string) (*process, error) {
	pid, err := strconv.Atoi(pidStr)
	if err != nil {
		return nil, errdefs.InvalidArgument("bad pid %q", pidStr)
	}
	a.mu.Lock()
	p, ok := a.procs[pid]
	a.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFound("process %d not found", pid)
	}
	return p, nil
}

func (a *Agent) processes() []agentproto.Process {
	a.mu.Lock()
	a.pruneLocked()
	out := make([]agentproto.Process, 0, len(a.procs))
	for _, p := range a.procs {
		out = append(out, p.snapshot())
	}
	a.mu.Unlock()
	slices.SortFunc(out, func(x, y agentproto.Process) int { return x.StartedAt.Compare(y.StartedAt) })
	return out
}

// writeStdin copies r to the process's stdin; eof closes it afterwards.
func (p *process) writeStdin(ctx context.Context, r io.Reader, eof bool) error {
	if p.stdinW == nil {
		return errdefs.Conflict("stdin of process %d is closed", p.pid)
	}
	select {
	case p.writeSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.writeSem }()
	stop := context.AfterFunc(ctx, func() { _ = p.stdinW.SetWriteDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() && !p.exited() {
			_ = p.stdinW.SetWriteDeadline(time.Time{})
		}
	}()
	// The data is read without stdinMu (a streamed body may sit idle),
	// written under it a chunk at a time.
	closed := errdefs.Conflict("stdin of process %d is closed", p.pid)
	bp := stdinBufs.Get().(*[]byte) // a terminal writes a keystroke per request
	defer stdinBufs.Put(bp)
	buf := *bp
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			p.stdinMu.Lock()
			if p.stdin == nil {
				p.stdinMu.Unlock()
				return closed
			}
			_, err := p.stdin.Write(buf[:n])
			p.stdinMu.Unlock()
			if err != nil {
				switch {
				case errors.Is(err, syscall.EPIPE):
					return errdefs.Conflict("process %d closed its stdin", p.pid)
				case p.exited():
					return errdefs.Conflict("process %d exited", p.pid)
				case ctx.Err() != nil:
					return ctx.Err()
				}
				return err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if eof {
		p.stdinMu.Lock()
		defer p.stdinMu.Unlock()
		if p.stdin == nil {
			return closed
		}
		if p.pty != nil {
			_, err := p.stdin.Write([]byte{4}) // ^D: end of input on a terminal
			return err
		}
		p.stdin.Close()
		p.stdin = nil
	}
	return nil
}

// stdinBufs holds writeStdin's copy buffers.
var stdinBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// exited reports whether the process's exit was seen.
func (p *process) exited() bool { return !p.snapshot().Running }

// signal sends sig to the process's group.
func (p *process) signal(sig string) error {
	s, err := parseSignal(sig)
	if err != nil {
		return err
	}
	if !p.snapshot().Running {
		return errdefs.Conflict("process %d is not running", p.pid)
	}
	if err := unix.Kill(-p.pid, s); err != nil {
		if err == unix.ESRCH {
			// Not a group leader any more (or the group is gone): try the process.
			if err = unix.Kill(p.pid, s); err == nil {
				return nil
			}
			return errdefs.Conflict("process %d is not running", p.pid)
		}
		return errdefs.Newf(classOf(err), "signal %d: %v", p.pid, err)
	}
	if s == unix.SIGKILL {
		go killGroupUntilGone(p.pid)
	}
	return nil
}

// killGroupUntilGone sends SIGKILL to process group pgid again until it
// has no member left (at most groupKillFor): gVisor's group kill is not
// atomic with the group's forks, and a fork bomb's child made while the
// signal went round survived it and started the bomb again.
func killGroupUntilGone(pgid int) {
	deadline := time.Now().Add(groupKillFor)
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if unix.Kill(-pgid, unix.SIGKILL) == unix.ESRCH {
			return
		}
	}
}

// groupKillFor bounds killGroupUntilGone (zombies count as members until
// reaped, which the agent does at once).
const groupKillFor = 10 * time.Second

func parseSignal(s string) (unix.Signal, error) {
	s = strings.ToUpper(strings.TrimSpace(s))
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 65 {
		return unix.Signal(n), nil
	}
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	if sig := unix.SignalNum(s); sig != 0 {
		return sig, nil
	}
	return 0, errdefs.InvalidArgument("unknown signal %q", s)
}

func (p *process) resize(size agentproto.PTYSize) error {
	if p.pty == nil {
		return errdefs.InvalidArgument("process %d has no terminal", p.pid)
	}
	if size.Cols == 0 || size.Rows == 0 {
		return errdefs.InvalidArgument("terminal size must be positive")
	}
	p.stdinMu.Lock() // the master is closed under this lock after exit
	defer p.stdinMu.Unlock()
	if !p.snapshot().Running {
		return errdefs.Conflict("process %d is not running", p.pid)
	}
	if err := setWinsize(p.pty, size.Rows, size.Cols); err != nil {
		return errdefs.Newf(errdefs.ErrInternal, "resize: %v", err)
	}
	return nil
}

// killAll SIGKILLs every running process group (used on Close).
func (a *Agent) killAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for pid, p := range a.procs {
		if p.snapshot().Running {
			_ = unix.Kill(-pid, unix.SIGKILL)
		}
	}
}
