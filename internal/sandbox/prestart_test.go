package sandbox

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent/agenttest"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// output reads a process's stdout from its first event until its exit.
func output(t *testing.T, c *agentclient.Client, pid int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev, err := c.Events(ctx, pid, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	return stdoutOf(ev)
}

// stdoutOf reads an event stream (the agent's or the service's) to its
// end and closes it: the stdout.
func stdoutOf(ev interface {
	Next() (agentproto.Event, error)
	Close() error
}) string {
	defer ev.Close()
	var out []byte
	for {
		e, err := ev.Next()
		if err != nil {
			return string(out)
		}
		if e.Type == agentproto.EventStdout {
			out = append(out, e.Data...)
		}
	}
}

func listed(t *testing.T, c *agentclient.Client, pid int) bool {
	t.Helper()
	ps, err := c.Processes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(ps, func(p agentproto.Process) bool { return p.PID == pid })
}

// The claim's Init settles what a pool started before it (the agent's
// side of Prestart): kept, a process reads the owner's environment as one
// line on its stdin, and so it does at every later identity (a fork's
// child gets one), as a process started with FollowInit does; not kept, it
// is killed and no longer listed. A process started without either is
// left alone.
func TestPrestartedSettledAtInit(t *testing.T) {
	ctx := context.Background()
	script := `read a; echo "first $a"; read b; echo "second $b"`
	// made is a directory made for a prestarted process (InitDiscard),
	// with a file in it, as the pool writes the kernel's script.
	made := func() string {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "made")
		if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "sub", "run.py"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	start := func(c *agentclient.Client, initStdin bool, discard ...string) int {
		t.Helper()
		pid, err := c.Start(ctx, agentproto.StartRequest{Cmd: []string{"/bin/sh", "-c", script}, Stdin: true, InitStdin: initStdin, InitDiscard: discard})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}

	kept := agenttest.Client(t, "")
	keptDir := made()
	pre, other := start(kept, true, keptDir), start(kept, false)
	// A following process gets each identity after a newline (ending
	// whatever a request cut short left on its stdin): it reads 4 lines.
	follower, err := kept.Start(ctx, agentproto.StartRequest{Cmd: []string{"/bin/sh", "-c", `read a; read b; read c; read d; echo "[$a][$b][$c][$d]"`}, Stdin: true, FollowInit: true})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TENANT": "alpha"}
	// An Init without an identity (a pool sandbox restored from its
	// image gets one with the clock and entropy) settles nothing.
	if err := kept.Init(ctx, agentproto.InitRequest{Entropy: []byte("0123456789abcdef")}); err != nil {
		t.Fatal(err)
	}
	if err := kept.Init(ctx, agentproto.InitRequest{SandboxID: "sb-1", Env: env, KeepPrestarted: true}); err != nil {
		t.Fatal(err)
	}
	// A second identity (a fork's child gets one) reaches the kept
	// process too: the copy runs with the child's env.
	if err := kept.Init(ctx, agentproto.InitRequest{SandboxID: "sb-2", Env: map[string]string{"TENANT": "beta"}}); err != nil {
		t.Fatal(err)
	}
	// pre and follower read their two lines and exit; other reads none
	// and needs its end of input.
	if err := kept.Stdin(ctx, other, strings.NewReader(""), true); err != nil {
		t.Fatal(err)
	}
	if got, want := output(t, kept, follower), "[][{\"init\":{\"env\":{\"TENANT\":\"alpha\"}}}][][{\"init\":{\"env\":{\"TENANT\":\"beta\"}}}]\n"; got != want {
		t.Errorf("a follow_init process printed %q, want %q", got, want)
	}
	// A kept prestarted process: its first line is the claim's identity,
	// the next one follows a newline.
	if got, want := output(t, kept, pre), "first {\"init\":{\"env\":{\"TENANT\":\"alpha\"}}}\nsecond \n"; got != want {
		t.Errorf("kept prestarted process printed %q, want %q", got, want)
	}
	if got := output(t, kept, other); got != "first \nsecond \n" {
		t.Errorf("a process started without init_stdin printed %q: it was written to", got)
	}
	if _, err := os.Stat(filepath.Join(keptDir, "sub", "run.py")); err != nil {
		t.Errorf("the files of a kept prestarted process were removed: %v", err)
	}

	dropped := agenttest.Client(t, "")
	droppedDir := made()
	pre, other = start(dropped, true, droppedDir), start(dropped, false)
	if err := dropped.Init(ctx, agentproto.InitRequest{SandboxID: "sb-3", Env: env}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(droppedDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("what was made for a prestarted process not kept is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(droppedDir)); err != nil {
		t.Errorf("the directory above the discarded one went too: %v", err)
	}
	if listed(t, dropped, pre) {
		t.Errorf("a prestarted process not kept is still listed after the Init")
	}
	if err := dropped.Signal(ctx, pre, "0"); err == nil {
		t.Errorf("a prestarted process not kept can still be signalled")
	}
	if !listed(t, dropped, other) {
		t.Fatalf("a process started without init_stdin was ended by the Init")
	}
	if err := dropped.Stdin(ctx, other, bytes.NewReader([]byte("x\ny\n")), true); err != nil {
		t.Fatal(err)
	}
	if got := output(t, dropped, other); got != "first x\nsecond y\n" {
		t.Errorf("the other process printed %q", got)
	}

	// init_stdin and follow_init need a stdin to write to; init_discard
	// needs init_stdin and clean absolute paths.
	for _, req := range []agentproto.StartRequest{
		{Cmd: []string{"true"}, InitStdin: true},
		{Cmd: []string{"true"}, FollowInit: true},
		{Cmd: []string{"true"}, InitDiscard: []string{droppedDir}},
		{Cmd: []string{"true"}, Stdin: true, InitStdin: true, InitDiscard: []string{"/"}},
		{Cmd: []string{"true"}, Stdin: true, InitStdin: true, InitDiscard: []string{"tmp/x"}},
		{Cmd: []string{"true"}, Stdin: true, InitStdin: true, InitDiscard: []string{"/tmp/../etc"}},
	} {
		if _, err := dropped.Start(ctx, req); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("start %+v: %v, want invalid argument", req, err)
		}
	}
}

// prestart waits for the process's Ready line, however the output is cut
// into reads, and no longer than it must: a process that exits first or
// never says it is ready does not hold the sandbox back from the pool
// (past prestartTimeout it joins with the process still running).
func TestPrestartWaitsForReady(t *testing.T) {
	defer func(d time.Duration) { prestartTimeout = d }(prestartTimeout)
	prestartTimeout = 2 * time.Second
	c := agenttest.Client(t, "")
	svc := New(Config{DataDir: t.TempDir()}, nil, nil, slog.New(slog.DiscardHandler), nil)
	w := &warm{sb: store.Sandbox{ID: "sb-prestart"}, agent: c}
	dir := t.TempDir()
	run := func(script, want string) (time.Duration, agentproto.Process) {
		t.Helper()
		ps := &Prestart{
			Files: map[string][]byte{dir + "/run.sh": []byte(script)},
			Start: agentproto.StartRequest{Cmd: []string{"/bin/sh", dir + "/run.sh"}, Tag: script},
			Ready: []byte("READY\n"),
		}
		t0 := time.Now()
		if got := svc.prestart(context.Background(), ps, w); got != want {
			t.Errorf("%q: prestart says %s, want %s", script, got, want)
		}
		d := time.Since(t0)
		procs, err := c.Processes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(procs, func(p agentproto.Process) bool { return p.Tag == script })
		if i < 0 {
			t.Fatalf("%q: not started", script)
		}
		return d, procs[i]
	}
	// Ready cut across reads, after other output.
	d, p := run("printf 'loading\\nRE'; sleep 0.3; printf 'ADY\\n'; exec sleep 60\n", prestartReady)
	if !p.Running || d < 300*time.Millisecond || d >= prestartTimeout {
		t.Errorf("ready in two reads: returned after %v (running %v), want once READY was printed", d, p.Running)
	}
	// A near miss is not ready.
	d, p = run("printf 'READ\\nY\\n'; exec sleep 60\n", prestartLate)
	if !p.Running || d < prestartTimeout {
		t.Errorf("never ready: returned after %v, want after the %v timeout with the process running", d, prestartTimeout)
	}
	// An exit ends the wait at once.
	d, p = run("echo loading; exit 3\n", prestartExited)
	if p.Running || d >= prestartTimeout {
		t.Errorf("exited: returned after %v (running %v), want at the exit", d, p.Running)
	}
}

// TestExitWithUnreadStdin: a process whose stdin data nobody reads (a
// child it left behind kept the pipe) still ends for its callers: its exit
// is reported, and a later write to its stdin is refused at once. The
// blocked write held the lock the exit needed, so the exit event never
// came and every later write or resize waited for good.
func TestExitWithUnreadStdin(t *testing.T) {
	c := agenttest.Client(t, "")
	ctx := context.Background()
	pidFile := filepath.Join(t.TempDir(), "child")
	script := `setsid -f sh -c 'echo $$ > ` + pidFile + `; exec sleep 120'; echo started`
	pid, err := c.Start(ctx, agentproto.StartRequest{Cmd: []string{"/bin/sh", "-c", script}, Stdin: true, StdinData: bytes.Repeat([]byte("x"), 512<<10)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(n, syscall.SIGKILL)
			}
		}
	}()
	if got := output(t, c, pid); got != "started\n" {
		t.Fatalf("output %q", got)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stdin(wctx, pid, strings.NewReader("more\n"), false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a write after the exit: %v, want a conflict", err)
	}
}
