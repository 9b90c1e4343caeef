package agent

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agentproto"
)

// Run is space-agent's main: it parses args (os.Args), serves until the
// transport ends and returns the exit code.
func Run(args []string) int {
	fs := flag.NewFlagSet("space-agent", flag.ContinueOnError)
	connect := fs.String("connect", "", "dial the host at `addr` (unix:/path) and serve sessions on it, redialing forever")
	listen := fs.String("listen", "", "listen on `addr` (unix:/path) and serve every connection (for local testing)")
	stdio := fs.Bool("stdio", false, "serve one session over stdin/stdout")
	serial := fs.String("serial", "", "serve sessions on the serial port at `path` (virtio-serial, e.g. /dev/virtio-ports/agent)")
	vsock := fs.String("vsock", "", "listen on AF_VSOCK `port` and serve every connection (Firecracker)")
	vmInitMode := fs.Bool("init", false, "run as a VM's init (PID 1 of the initramfs): mount the root disk and switch to it first")
	user := fs.String("user", "user", "default user for processes and files")
	home := fs.String("home", "/home/user", "directory relative paths are resolved against")
	authFile := fs.String("auth-file", "", "answer the host's challenge on every connection with the secret in `path` (read at start, kept in memory)")
	verbose := fs.Bool("v", false, "debug logging")
	if len(args) > 0 {
		args = args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	// Logs go to stderr: with --stdio, stdout carries the session.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	if *vmInitMode {
		inVM = true
		if err := vmInit(log); err != nil {
			log.Error("vm init", "err", err)
			powerOff()
			return 1
		}
		defer powerOff()
	}

	var t Transport
	switch {
	case *vsock != "" && *serial == "" && *connect == "" && *listen == "" && !*stdio:
		port, err := ParseVsockPort(*vsock)
		if err != nil {
			log.Error("bad --vsock", "err", err)
			return 2
		}
		t = Vsock(port)
	case *serial != "" && *connect == "" && *listen == "" && !*stdio:
		t = Serial(*serial)
	case *connect != "" && *listen == "" && !*stdio:
		network, addr, err := parseAddr(*connect)
		if err != nil {
			log.Error("bad --connect", "err", err)
			return 2
		}
		t = Dial(network, addr)
	case *listen != "" && *connect == "" && !*stdio:
		network, addr, err := parseAddr(*listen)
		if err != nil {
			log.Error("bad --listen", "err", err)
			return 2
		}
		if network == "unix" {
			_ = os.Remove(addr)
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			log.Error("listen", "err", err)
			return 1
		}
		t = Listen(ln)
	case *stdio && *connect == "" && *listen == "":
		t = Stdio()
	default:
		fmt.Fprintln(os.Stderr, "space-agent: exactly one of --connect, --listen, --stdio, --serial, --vsock is required")
		fs.Usage()
		return 2
	}

	pid1 := os.Getpid() == 1
	if !pid1 {
		// Become the reaper of our own orphans anyway, so reap-all is safe.
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	}
	mem := memTotal()
	if mem > 0 && os.Getenv("GOMEMLIMIT") == "" {
		// Collect garbage before the agent's heap reaches a quarter of the
		// sandbox's memory (its retained output is bounded at an eighth),
		// rather than letting it double its live size first; never below
		// 32 MiB, where a small sandbox's agent would collect all the time.
		debug.SetMemoryLimit(max(mem/4, 32<<20))
	}
	opts := Options{User: *user, Home: *home, Memory: mem, ReapAll: true, Logger: log}
	if *authFile != "" {
		secret, err := agentproto.ReadSecret(*authFile)
		if err != nil {
			// Without it no host accepts this agent: fail loudly.
			log.Error("auth file", "err", err)
			return 1
		}
		opts.AuthSecret, opts.AuthFile = secret, *authFile
	}
	a := New(opts)
	defer a.Close()

	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	// SIGUSR1 from the host (runsc kill): probe the session now.
	probe := make(chan os.Signal, 1)
	signal.Notify(probe, unix.SIGUSR1)
	defer signal.Stop(probe)
	go func() {
		for range probe {
			a.ProbeSession()
		}
	}()
	log.Info("space-agent started", "pid", os.Getpid())
	if err := a.Serve(ctx, t); err != nil && ctx.Err() == nil {
		log.Error("serve", "err", err)
		return 1
	}
	return 0
}

// memTotal returns MemTotal from /proc/meminfo in bytes (0 when unknown).
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return parseMemTotal(b)
}

func parseMemTotal(meminfo []byte) int64 {
	for line := range strings.Lines(string(meminfo)) {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb <= 0 {
			return 0
		}
		return kb << 10
	}
	return 0
}
