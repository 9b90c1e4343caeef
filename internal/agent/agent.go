// Package agent is the guest side of space: the space-agent program that
// runs inside every sandbox (as PID 1) and serves the agentproto HTTP API
// over a yamux session to the host — processes with buffered, re-attachable
// output, PTYs, files and inotify watches.
//
// The agent imports only agentproto, errdefs, the standard library, x/sys,
// yamux, and is built as a static binary (CGO_ENABLED=0).
package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/spacesandbox/space/internal/agentproto"
	"golang.org/x/sys/unix"
)

// Options configure an Agent. The zero value is the production setup.
type Options struct {
	// User is the default user processes run as and files are owned by
	// ("user" when empty).
	User string
	// Home resolves relative file paths ("/home/user" when empty).
	Home string
	// Memory is the sandbox's memory in bytes (Run reads MemTotal from
	// /proc/meminfo, which is the sandbox's limit under gVisor and the
	// guest's memory in a VM); 0 when unknown. The output budgets below
	// default to fractions of it, because output retained by the agent is
	// memory of the sandbox: too much and the sandbox is stopped for OOM.
	Memory int64
	// MaxOutput is the retained output per process (8 MiB when 0, less in
	// a sandbox whose running budget is smaller).
	MaxOutput int
	// MaxRunningOutput bounds the output retained by all running processes
	// together: each keeps at most MaxRunningOutput / (processes running),
	// and at most MaxOutput. Default: two thirds of an eighth of Memory (of
	// 48 MiB when Memory is unknown or above 384 MiB), so 32 MiB: four
	// processes keep 8 MiB each, sixteen 2 MiB. Without it every running
	// process would keep MaxOutput, and a dozen chatty background
	// processes would exhaust a small sandbox's memory.
	MaxRunningOutput int
	// MaxExitedOutput bounds the output retained by all exited processes
	// together (the other third of that eighth: 16 MiB when 0 and Memory
	// is unknown or large): the newest exits keep theirs, older ones what
	// is left of it, and at least their exit event. Without it every
	// exited process would keep MaxOutput, and a few commands with large
	// output would exhaust a small sandbox's memory.
	MaxExitedOutput int
	// ReapAll makes the agent reap every child, orphans included (set it
	// when the agent is PID 1; Run does).
	ReapAll bool
	// Logger receives diagnostics (discarded when nil).
	Logger *slog.Logger
	// AuthSecret, when set, answers the host's challenge before every
	// session (agentproto.AnswerAuth); AuthFile, the file it was read
	// from, is removed after the first session that authenticated.
	AuthSecret []byte
	AuthFile   string
}

// The output budget of all processes together: an eighth of the
// sandbox's memory, within these bounds.
const (
	maxOutputBudget = 48 << 20
	minOutputBudget = 3 << 20
)

// Agent serves the agent protocol. Processes and their output belong to
// the Agent, not to a connection, so they survive reconnects.
type Agent struct {
	opts    Options
	log     *slog.Logger
	reaper  *reaper
	handler http.Handler
	cpu     cpuMeter
	// null is /dev/null opened once (close-on-exec), every process's
	// stdin unless it asks for one; nullErr if it could not be opened.
	null    int
	nullErr error

	// initMu makes Inits one at a time: a server that restarted in the
	// middle of one sends its own while the first may still run, and the
	// identity (env, egress) must be one Init's, whole.
	initMu sync.Mutex

	authFileOnce sync.Once // removes Options.AuthFile after the first handshake

	mu        sync.Mutex
	sess      *yamux.Session // the current host session (nil between sessions)
	watches   atomic.Int32   // file watch streams open (at most maxWatches)
	egressLn  net.Listener
	procs     map[int]*process
	initEnv   map[string]string
	sandboxID string
}

// New returns an Agent. Close it to stop its reaper and kill its processes.
func New(opts Options) *Agent {
	if opts.User == "" {
		opts.User = "user"
	}
	if opts.Home == "" {
		opts.Home = "/home/user"
	}
	total := int64(maxOutputBudget)
	if opts.Memory > 0 {
		total = min(total, max(opts.Memory/8, minOutputBudget))
	}
	if opts.MaxRunningOutput <= 0 {
		opts.MaxRunningOutput = int(total * 2 / 3)
	}
	if opts.MaxExitedOutput <= 0 {
		opts.MaxExitedOutput = int(total / 3)
	}
	if opts.MaxOutput <= 0 {
		opts.MaxOutput = min(8<<20, opts.MaxRunningOutput)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Agent{
		opts:   opts,
		log:    opts.Logger,
		reaper: newReaper(opts.ReapAll),
		procs:  map[int]*process{},
		cpu:    cpuMeter{read: readCPUTimes, sleep: time.Sleep},
	}
	a.null, a.nullErr = unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	a.handler = a.routes()
	return a
}

func (a *Agent) devNull() (int, error) { return a.null, a.nullErr }

// Handler returns the agent's HTTP handler.
func (a *Agent) Handler() http.Handler { return a.handler }

// Close kills every running process and stops reaping.
func (a *Agent) Close() error {
	a.killAll()
	// Give the reaper a moment to collect the killed processes.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		running := 0
		for _, p := range a.procs {
			if p.snapshot().Running {
				running++
			}
		}
		a.mu.Unlock()
		if running == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	a.reaper.close()
	if a.nullErr == nil {
		unix.Close(a.null)
	}
	return nil
}

// yamuxConfig is shared by both ends: large stream windows so one stream
// can carry bulk output, and no yamux logging.
func yamuxConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.MaxStreamWindowSize = 4 << 20
	cfg.AcceptBacklog = 1024
	cfg.LogOutput = io.Discard
	// The keepalive is only the backstop for noticing a host socket that
	// was cut under the agent (gVisor drops host sockets at checkpoint;
	// the guest sees EPIPE only on its next write): the host signals the
	// agent to probe at once (ProbeSession) after every checkpoint and
	// restore. Each ping wakes the whole sandbox, so it is rare: at 500 ms,
	// 40 idle gVisor sandboxes kept a quarter of this 2-core host busy.
	cfg.KeepAliveInterval = 30 * time.Second
	cfg.ConnectionWriteTimeout = 5 * time.Second
	return cfg
}

// ProbeSession checks the live host session now, as a keepalive would:
// a session whose connection is dead fails the ping's write and closes,
// so the transport dials the host again; a live one is left alone.
func (a *Agent) ProbeSession() {
	a.mu.Lock()
	sess := a.sess
	a.mu.Unlock()
	if sess == nil {
		return
	}
	go func() {
		if _, err := sess.Ping(); err != nil {
			a.log.Debug("session probe failed; reconnecting", "err", err)
			sess.Close()
		}
	}()
}

// ServeConn serves one yamux session over conn until it breaks.
func (a *Agent) ServeConn(ctx context.Context, conn io.ReadWriteCloser) error {
	defer conn.Close()
	if a.opts.AuthSecret != nil {
		if err := agentproto.AnswerAuth(conn, a.opts.AuthSecret); err != nil {
			return err
		}
		// The secret lives on in memory only. (Under gVisor the mount
		// is read-only for the agent: the host removes the file.)
		a.authFileOnce.Do(func() {
			if a.opts.AuthFile != "" {
				_ = os.Remove(a.opts.AuthFile)
			}
		})
	}
	sess, err := yamux.Server(conn, yamuxConfig())
	if err != nil {
		return err
	}
	defer sess.Close()
	a.mu.Lock()
	a.sess = sess
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		if a.sess == sess {
			a.sess = nil
		}
		a.mu.Unlock()
	}()
	srv := &http.Server{
		Handler:           a.handler,
		ReadHeaderTimeout: time.Minute,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	err = srv.Serve(sess)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Serve serves every connection t yields until ctx ends or t fails.
func (a *Agent) Serve(ctx context.Context, t Transport) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := t.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		a.log.Debug("session started")
		wg.Go(func() {
			err := a.ServeConn(ctx, conn)
			a.log.Debug("session ended", "err", err)
		})
	}
}
