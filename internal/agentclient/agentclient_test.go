package agentclient_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/hashicorp/yamux"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

// harness is a real agent that dials the host's unix socket (the
// --connect mode) and a client on the host side of that socket.
type harness struct {
	c    *agentclient.Client
	a    *agent.Agent
	home string

	mu   sync.Mutex
	conn net.Conn // the host side of the current session
}

func newHarness(t testing.TB, opts agent.Options) *harness {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	opts.User, opts.Home = u.Username, home
	a := agent.New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = a.Serve(ctx, agent.Dial("unix", sock))
	}()
	h := &harness{a: a, home: home}
	accept := agentclient.AcceptDialer(ln)
	h.c = agentclient.New(func(ctx context.Context) (net.Conn, error) {
		conn, err := accept(ctx)
		if err == nil {
			h.mu.Lock()
			h.conn = conn
			h.mu.Unlock()
		}
		return conn, err
	}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() {
		h.c.Close()
		cancel()
		ln.Close()
		<-served
		a.Close()
	})
	return h
}

type result struct {
	stdout, stderr []byte
	exit           agentproto.Event
	events         []agentproto.Event
}

func (r result) code() int {
	if r.exit.ExitCode == nil {
		return -1
	}
	return *r.exit.ExitCode
}

// collect reads a process's events from seq from until the stream ends.
func collect(t *testing.T, h *harness, pid int, from uint64, follow bool) result {
	t.Helper()
	es, err := h.c.Events(t.Context(), pid, from, follow)
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	r, err := readEvents(es)
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	return r
}

// readEvents reads es to its end and closes it.
func readEvents(es *agentclient.EventStream) (result, error) {
	defer es.Close()
	var r result
	for {
		ev, err := es.Next()
		if err == io.EOF {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		r.events = append(r.events, ev)
		switch ev.Type {
		case agentproto.EventStdout:
			r.stdout = append(r.stdout, ev.Data...)
		case agentproto.EventStderr:
			r.stderr = append(r.stderr, ev.Data...)
		case agentproto.EventExit:
			r.exit = ev
		}
	}
}

func run(t *testing.T, h *harness, req agentproto.StartRequest) result {
	t.Helper()
	pid, err := h.c.Start(t.Context(), req)
	if err != nil {
		t.Fatalf("start %+v: %v", req, err)
	}
	return collect(t, h, pid, 1, true)
}

func waitExited(t *testing.T, h *harness, pid int) agentproto.Process {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p, err := h.c.Process(t.Context(), pid)
		if err != nil {
			t.Fatal(err)
		}
		if !p.Running {
			return p
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d still running", pid)
	return agentproto.Process{}
}

func TestExec(t *testing.T) {
	h := newHarness(t, agent.Options{})
	info, err := h.c.Info(t.Context())
	if err != nil || info.Version != agentproto.Version || info.PID != os.Getpid() {
		t.Fatalf("info = %+v, %v", info, err)
	}

	t.Run("echo", func(t *testing.T) {
		r := run(t, h, agentproto.StartRequest{Cmd: []string{"echo", "hello", "world"}})
		if string(r.stdout) != "hello world\n" || r.code() != 0 {
			t.Fatalf("stdout %q code %d", r.stdout, r.code())
		}
		if r.events[0].Type != agentproto.EventStart || r.events[0].Seq != 1 || r.events[0].PID == 0 {
			t.Fatalf("first event %+v", r.events[0])
		}
		for i, ev := range r.events {
			if ev.Seq != uint64(i+1) {
				t.Fatalf("event %d has seq %d", i, ev.Seq)
			}
		}
	})
	t.Run("nonzero", func(t *testing.T) {
		r := run(t, h, agentproto.StartRequest{Shell: "exit 3"})
		if r.code() != 3 || r.exit.Signal != "" {
			t.Fatalf("exit %+v", r.exit)
		}
	})
	t.Run("stderr", func(t *testing.T) {
		r := run(t, h, agentproto.StartRequest{Shell: "echo out; echo err >&2"})
		if string(r.stdout) != "out\n" || string(r.stderr) != "err\n" {
			t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
		}
	})
	t.Run("env-cwd", func(t *testing.T) {
		if err := h.c.Init(t.Context(), agentproto.InitRequest{SandboxID: "sb1", Env: map[string]string{"FROM_INIT": "i", "BOTH": "init"}}); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		r := run(t, h, agentproto.StartRequest{
			Shell: `echo "$FROM_INIT $FROM_REQ $BOTH $LANG"; pwd`,
			Env:   map[string]string{"FROM_REQ": "r", "BOTH": "req"},
			Cwd:   dir,
		})
		if want := "i r req C.UTF-8\n" + dir + "\n"; string(r.stdout) != want {
			t.Fatalf("stdout %q, want %q", r.stdout, want)
		}
	})
	t.Run("not-found", func(t *testing.T) {
		_, err := h.c.Start(t.Context(), agentproto.StartRequest{Cmd: []string{"no-such-binary-xyz"}})
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("err = %v", err)
		}
		_, err = h.c.Start(t.Context(), agentproto.StartRequest{})
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("err = %v", err)
		}
		_, err = h.c.Events(t.Context(), 999999, 1, true)
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("binary", func(t *testing.T) {
		data := make([]byte, 3*256*1024)
		for i := range data {
			data[i] = byte(i * 7 % 256)
		}
		f := filepath.Join(t.TempDir(), "bin")
		if err := os.WriteFile(f, data, 0o644); err != nil {
			t.Fatal(err)
		}
		r := run(t, h, agentproto.StartRequest{Cmd: []string{"cat", f}})
		if !bytes.Equal(r.stdout, data) {
			t.Fatalf("binary output differs (%d bytes, want %d)", len(r.stdout), len(data))
		}
	})
	t.Run("stdin", func(t *testing.T) {
		pid, err := h.c.Start(t.Context(), agentproto.StartRequest{Cmd: []string{"cat"}, Stdin: true, StdinData: []byte("first ")})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.c.Stdin(t.Context(), pid, strings.NewReader("second "), false); err != nil {
			t.Fatal(err)
		}
		if err := h.c.Stdin(t.Context(), pid, strings.NewReader("third"), true); err != nil {
			t.Fatal(err)
		}
		r := collect(t, h, pid, 1, true)
		if string(r.stdout) != "first second third" || r.code() != 0 {
			t.Fatalf("stdout %q code %d", r.stdout, r.code())
		}
		if err := h.c.Stdin(t.Context(), pid, strings.NewReader("late"), false); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("stdin after exit: %v", err)
		}
		// Without Stdin, StdinData is followed by EOF.
		r = run(t, h, agentproto.StartRequest{Cmd: []string{"wc", "-c"}, StdinData: []byte("12345")})
		if strings.TrimSpace(string(r.stdout)) != "5" {
			t.Fatalf("wc -c: %q", r.stdout)
		}
	})
	t.Run("signal", func(t *testing.T) {
		pid, err := h.c.Start(t.Context(), agentproto.StartRequest{Shell: "sleep 100 & wait", Tag: "sleeper"})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.c.Signal(t.Context(), pid, "TERM"); err != nil {
			t.Fatal(err)
		}
		r := collect(t, h, pid, 1, true)
		if r.exit.Signal != "SIGTERM" || r.code() != 143 {
			t.Fatalf("exit %+v", r.exit)
		}
		if err := h.c.Signal(t.Context(), pid, "BOGUS"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("bogus signal: %v", err)
		}
		p, err := h.c.Process(t.Context(), pid)
		if err != nil || p.Running || p.Tag != "sleeper" || p.ExitCode == nil {
			t.Fatalf("process %+v, %v", p, err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		r := run(t, h, agentproto.StartRequest{Cmd: []string{"sleep", "100"}, TimeoutMS: 200})
		if r.exit.Error != "timeout" || r.exit.Signal != "SIGKILL" {
			t.Fatalf("exit %+v", r.exit)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("took %v", d)
		}
	})
	t.Run("orphan-holds-output", func(t *testing.T) {
		// A background child keeps the pipes open; the exit still arrives.
		for _, pty := range []*agentproto.PTYSize{nil, {Rows: 24, Cols: 80}} {
			start := time.Now()
			r := run(t, h, agentproto.StartRequest{Cmd: []string{"/bin/sh", "-c", "sleep 3 & echo hi"}, PTY: pty})
			if !strings.Contains(string(r.stdout), "hi") || r.code() != 0 {
				t.Fatalf("pty %v: stdout %q exit %+v", pty != nil, r.stdout, r.exit)
			}
			if d := time.Since(start); d > 2500*time.Millisecond {
				t.Fatalf("pty %v: exit took %v", pty != nil, d)
			}
		}
	})
	t.Run("list", func(t *testing.T) {
		ps, err := h.c.Processes(t.Context())
		if err != nil || len(ps) < 5 {
			t.Fatalf("processes: %d, %v", len(ps), err)
		}
	})
}

func TestLargeOutputLossless(t *testing.T) {
	h := newHarness(t, agent.Options{})
	const size = 20 << 20
	want := bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz\n"), size/37+1)[:size]
	r := run(t, h, agentproto.StartRequest{Shell: fmt.Sprintf("yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c %d", size)})
	if r.code() != 0 {
		t.Fatalf("exit %+v", r.exit)
	}
	for _, ev := range r.events {
		if ev.Type == agentproto.EventTruncated {
			t.Fatal("attached reader saw a truncated event")
		}
	}
	if len(r.stdout) != size || sha256.Sum256(r.stdout) != sha256.Sum256(want) {
		t.Fatalf("got %d bytes, want %d (content differs)", len(r.stdout), size)
	}
}

// A reader that hands each event's data back (Recycle) gets every byte
// intact while the stream reads later frames into the same few buffers.
func TestRecycledStreamLossless(t *testing.T) {
	h := newHarness(t, agent.Options{})
	const size = 20 << 20
	want := bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz\n"), size/37+1)[:size]
	_, es, err := h.c.Run(t.Context(), agentproto.StartRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c %d", size)}})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	sum := sha256.New()
	n, frames := 0, 0
	buffers := map[*byte]bool{}
	for {
		ev, err := es.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == agentproto.EventStdout {
			sum.Write(ev.Data)
			n += len(ev.Data)
			frames++
			buffers[&ev.Data[:1][0]] = true
			clear(ev.Data) // a stream that reused this buffer early would now deliver zeros
			es.Recycle(ev.Data)
		}
	}
	if wantSum := sha256.Sum256(want); n != size || !bytes.Equal(sum.Sum(nil), wantSum[:]) {
		t.Fatalf("got %d bytes, want %d (content differs)", n, size)
	}
	if frames > 8 && len(buffers) > frames/2 {
		t.Fatalf("%d frames used %d buffers: nothing was reused", frames, len(buffers))
	}
}

func TestBackgroundReattach(t *testing.T) {
	h := newHarness(t, agent.Options{MaxOutput: 256 << 10})
	pid, err := h.c.Start(t.Context(), agentproto.StartRequest{Shell: "for i in 1 2 3 4 5; do echo line$i; sleep 0.01; done"})
	if err != nil {
		t.Fatal(err)
	}
	waitExited(t, h, pid)
	all := collect(t, h, pid, 1, false)
	if string(all.stdout) != "line1\nline2\nline3\nline4\nline5\n" || all.code() != 0 {
		t.Fatalf("stdout %q exit %+v", all.stdout, all.exit)
	}
	// Re-attach from the middle: exactly the later events come back.
	mid := all.events[3].Seq
	rest := collect(t, h, pid, mid, true)
	if len(rest.events) != len(all.events)-3 || rest.events[0].Seq != mid {
		t.Fatalf("re-attach from %d: %d events, first %+v", mid, len(rest.events), rest.events[0])
	}

	// An unattached process keeps only its newest output and says so.
	const size = 4 << 20
	pid, err = h.c.Start(t.Context(), agentproto.StartRequest{Shell: fmt.Sprintf("head -c %d /dev/zero; echo END", size)})
	if err != nil {
		t.Fatal(err)
	}
	waitExited(t, h, pid)
	r := collect(t, h, pid, 1, true)
	if r.events[0].Type != agentproto.EventTruncated || r.events[0].Seq <= 1 {
		t.Fatalf("first event %+v, want truncated", r.events[0])
	}
	if len(r.stdout) > 256<<10 || !bytes.HasSuffix(r.stdout, []byte("END\n")) || r.code() != 0 {
		t.Fatalf("retained %d bytes, suffix %q, exit %+v", len(r.stdout), r.stdout[max(0, len(r.stdout)-8):], r.exit)
	}
}

// Exited processes together keep at most MaxExitedOutput: the newest exits
// keep their output, older ones what is left of the budget and at least
// their exit (so a sandbox that runs many
// commands with large output does not fill its memory with old output).
func TestExitedOutputBudget(t *testing.T) {
	const limit, budget = 64 << 10, 128 << 10
	h := newHarness(t, agent.Options{MaxOutput: limit, MaxExitedOutput: budget})
	var pids []int
	for i := range 6 {
		pid, err := h.c.Start(t.Context(), agentproto.StartRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("head -c 100000 /dev/zero; echo END%d", i)}})
		if err != nil {
			t.Fatal(err)
		}
		waitExited(t, h, pid)
		pids = append(pids, pid)
	}
	// The budget is applied right after each exit is recorded; wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		total, results := 0, make([]result, len(pids))
		for i, pid := range pids {
			results[i] = collect(t, h, pid, 1, false)
			total += len(results[i].stdout)
		}
		if total <= budget {
			for i, r := range results {
				if r.code() != 0 {
					t.Fatalf("process %d lost its exit: %+v", i, r.exit)
				}
				newest := i >= len(pids)-2
				if newest && (len(r.stdout) < limit/2 || !bytes.HasSuffix(r.stdout, fmt.Appendf(nil, "END%d\n", i))) {
					t.Fatalf("newest process %d kept %d bytes", i, len(r.stdout))
				}
				if i == 0 && (len(r.stdout) > limit/4 || r.events[0].Type != agentproto.EventTruncated) {
					t.Fatalf("oldest process kept %d bytes, first event %+v", len(r.stdout), r.events[0])
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("exited processes retain %d bytes, budget %d", total, budget)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Running processes share MaxRunningOutput: with eight running, each keeps
// an eighth (its newest output), so a dozen chatty background processes
// cannot fill a small sandbox's memory; a reader attached all along still
// receives every byte of its process.
func TestRunningOutputBudget(t *testing.T) {
	const limit, budget, n = 64 << 10, 128 << 10, 8
	h := newHarness(t, agent.Options{MaxOutput: limit, MaxRunningOutput: budget})
	// One process streams to a reader attached from its start (Run) while
	// the others start.
	_, es, err := h.c.Run(t.Context(), agentproto.StartRequest{Cmd: []string{"sh", "-c", "head -c 1000000 /dev/zero; echo END"}})
	if err != nil {
		t.Fatal(err)
	}
	attached := make(chan result, 1)
	go func() {
		r, _ := readEvents(es) // an error shows as missing output below
		attached <- r
	}()
	var pids []int
	for i := range n {
		pid, err := h.c.Start(t.Context(), agentproto.StartRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("head -c 100000 /dev/zero; echo READY%d; exec sleep 60", i)}})
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if r := <-attached; len(r.stdout) != 1000000+4 || !bytes.HasSuffix(r.stdout, []byte("END\n")) || r.code() != 0 {
		t.Fatalf("attached reader got %d bytes, exit %+v", len(r.stdout), r.exit)
	}
	total := 0
	for i, pid := range pids {
		marker := fmt.Appendf(nil, "READY%d\n", i)
		var r result
		deadline := time.Now().Add(20 * time.Second)
		for r = collect(t, h, pid, 1, false); !bytes.HasSuffix(r.stdout, marker); r = collect(t, h, pid, 1, false) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d: %d bytes, no marker", i, len(r.stdout))
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(r.stdout) > budget/n || r.events[0].Type != agentproto.EventTruncated {
			t.Fatalf("process %d of %d running keeps %d bytes (share %d), first event %+v", i, n, len(r.stdout), budget/n, r.events[0])
		}
		total += len(r.stdout)
	}
	if total > budget {
		t.Fatalf("running processes retain %d bytes, budget %d", total, budget)
	}
	for _, pid := range pids {
		if err := h.c.Signal(t.Context(), pid, "KILL"); err != nil {
			t.Fatal(err)
		}
	}
}

// Reclaim kills the process with the most resident memory among the
// agent's descendants (a grandchild here) and leaves the others running;
// a process started through the agent reports error "oom" when it is the
// one killed.
func TestReclaimKillsLargest(t *testing.T) {
	h := newHarness(t, agent.Options{})
	small, err := h.c.Start(t.Context(), agentproto.StartRequest{Cmd: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	big, err := h.c.Start(t.Context(), agentproto.StartRequest{Cmd: []string{"python3", "-c", "import sys, time; x = b'x' * (64 << 20); print('ready', flush=True); time.sleep(60)"}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for r := collect(t, h, big, 1, false); !bytes.Contains(r.stdout, []byte("ready")); r = collect(t, h, big, 1, false) {
		if time.Now().After(deadline) {
			t.Fatal("the allocating process never got ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	v, err := h.c.Reclaim(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if v.PID != big || v.RSS < 64<<20 || !strings.Contains(v.Cmd, "python3") {
		t.Fatalf("reclaim killed %+v, want pid %d", v, big)
	}
	r := collect(t, h, big, 1, true)
	if r.exit.Signal != "SIGKILL" || r.exit.Error != "oom" {
		t.Fatalf("exit of the killed process: %+v", r.exit)
	}
	if p, err := h.c.Process(t.Context(), small); err != nil || !p.Running {
		t.Fatalf("the small process: %+v %v", p, err)
	}
	// A grandchild is found too (the shell stays; its child is killed).
	sh, err := h.c.Start(t.Context(), agentproto.StartRequest{Shell: "python3 -c \"import time; x = b'x' * (64 << 20); print('ready', flush=True); time.sleep(60)\"; echo after $?"})
	if err != nil {
		t.Fatal(err)
	}
	for r := collect(t, h, sh, 1, false); !bytes.Contains(r.stdout, []byte("ready")); r = collect(t, h, sh, 1, false) {
		if time.Now().After(deadline) {
			t.Fatal("the allocating grandchild never got ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v, err = h.c.Reclaim(t.Context()); err != nil || v.PID == 0 || v.PID == sh || v.PID == small {
		t.Fatalf("reclaim with a grandchild: %+v %v", v, err)
	}
	if r := collect(t, h, sh, 1, true); !bytes.Contains(r.stdout, []byte("after 137")) || r.exit.Error != "" {
		t.Fatalf("the shell after its child was killed: %q %+v", r.stdout, r.exit)
	}
	h.c.Signal(t.Context(), small, "KILL")
}

// A reader that goes away must not stall the process (its backpressure is
// released with the subscriber).
func TestDetachReleasesProcess(t *testing.T) {
	h := newHarness(t, agent.Options{MaxOutput: 64 << 10})
	pid, err := h.c.Start(t.Context(), agentproto.StartRequest{Shell: "head -c 50000000 /dev/zero"})
	if err != nil {
		t.Fatal(err)
	}
	es, err := h.c.Events(t.Context(), pid, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := es.Next(); err != nil {
			t.Fatal(err)
		}
	}
	es.Close()
	p := waitExited(t, h, pid)
	if *p.ExitCode != 0 {
		t.Fatalf("exit %+v", p)
	}
}

func TestPTY(t *testing.T) {
	h := newHarness(t, agent.Options{})
	pid, err := h.c.Start(t.Context(), agentproto.StartRequest{
		Shell: "stty size; read x; stty size; echo got:$x; echo term:$TERM",
		PTY:   &agentproto.PTYSize{Rows: 24, Cols: 80},
	})
	if err != nil {
		t.Fatal(err)
	}
	es, err := h.c.Events(t.Context(), pid, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	var out strings.Builder
	waitFor := func(s string) {
		t.Helper()
		for !strings.Contains(out.String(), s) {
			ev, err := es.Next()
			if err != nil {
				t.Fatalf("waiting for %q in %q: %v", s, out.String(), err)
			}
			out.Write(ev.Data)
		}
	}
	waitFor("24 80")
	if err := h.c.Resize(t.Context(), pid, agentproto.PTYSize{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Stdin(t.Context(), pid, strings.NewReader("hi\n"), false); err != nil {
		t.Fatal(err)
	}
	waitFor("30 100")
	waitFor("got:hi")
	waitFor("term:xterm")
	for {
		ev, err := es.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == agentproto.EventExit && *ev.ExitCode != 0 {
			t.Fatalf("exit %+v", ev)
		}
	}
	if err := h.c.Resize(t.Context(), pid, agentproto.PTYSize{Rows: 1, Cols: 1}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("resize after exit: %v", err)
	}
}

func TestConcurrentExec(t *testing.T) {
	h := newHarness(t, agent.Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Go(func() {
			pid, err := h.c.Start(t.Context(), agentproto.StartRequest{Cmd: []string{"echo", fmt.Sprint(i)}})
			if err != nil {
				errs <- err
				return
			}
			es, err := h.c.Events(t.Context(), pid, 1, true)
			if err != nil {
				errs <- err
				return
			}
			defer es.Close()
			var out []byte
			for {
				ev, err := es.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					errs <- err
					return
				}
				out = append(out, ev.Data...)
			}
			if string(out) != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("exec %d: got %q", i, out)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestReconnect(t *testing.T) {
	h := newHarness(t, agent.Options{})
	pid, err := h.c.Start(t.Context(), agentproto.StartRequest{Shell: "echo before; sleep 0.3; echo after"})
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.conn.Close() // the session dies under the client
	h.mu.Unlock()

	// The next calls redial (the agent reconnects on its own).
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := h.c.Info(t.Context())
		if err == nil {
			break
		}
		if !errors.Is(err, errdefs.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("info after reconnect: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := collect(t, h, pid, 1, true)
	if string(r.stdout) != "before\nafter\n" || r.code() != 0 {
		t.Fatalf("stdout %q exit %+v", r.stdout, r.exit)
	}

	// A following stream cut by a dying session (as a checkpoint cuts it)
	// re-attaches by itself: every event arrives once, in order. Both
	// ways of following: Run and Events.
	for _, how := range []string{"run", "events"} {
		req := agentproto.StartRequest{Shell: "for i in 1 2 3 4 5 6; do echo $i; sleep 0.1; done"}
		var es *agentclient.EventStream
		if how == "run" {
			_, es, err = h.c.Run(t.Context(), req)
		} else {
			if pid, err = h.c.Start(t.Context(), req); err == nil {
				es, err = h.c.Events(t.Context(), pid, 1, true)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		var out []byte
		var seqs []uint64
		cuts := 0
		for {
			ev, err := es.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: next after %d cuts: %v", how, cuts, err)
			}
			seqs = append(seqs, ev.Seq)
			if ev.Type == agentproto.EventStdout {
				out = append(out, ev.Data...)
				if cuts < 2 {
					h.mu.Lock()
					h.conn.Close()
					h.mu.Unlock()
					cuts++
				}
			}
		}
		es.Close()
		if string(out) != "1\n2\n3\n4\n5\n6\n" || cuts != 2 {
			t.Errorf("%s: output across %d cuts %q", how, cuts, out)
		}
		for i := 1; i < len(seqs); i++ {
			if seqs[i] != seqs[i-1]+1 {
				t.Errorf("%s: seqs %v", how, seqs)
				break
			}
		}
	}

	// A closed stream does not re-attach.
	old := agentclient.ReattachWithin
	agentclient.ReattachWithin = time.Minute
	t.Cleanup(func() { agentclient.ReattachWithin = old })
	pid, err = h.c.Start(t.Context(), agentproto.StartRequest{Cmd: []string{"sleep", "10"}})
	if err != nil {
		t.Fatal(err)
	}
	es, err := h.c.Events(t.Context(), pid, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := es.Next(); err != nil {
		t.Fatal(err)
	}
	es.Close()
	start := time.Now()
	if _, err := es.Next(); err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("next on a closed stream: %v after %v", err, time.Since(start))
	}
}

// An agent that takes requests and never answers fails unary calls with a
// deadline error instead of holding them forever.
func TestUnaryCallTimeout(t *testing.T) {
	old := agentclient.UnaryTimeout
	agentclient.UnaryTimeout = 100 * time.Millisecond
	t.Cleanup(func() { agentclient.UnaryTimeout = old })
	hostEnd, agentEnd := net.Pipe()
	sess, err := yamux.Server(agentEnd, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	go func() {
		for { // accept every stream and say nothing
			if _, err := sess.Accept(); err != nil {
				return
			}
		}
	}()
	c := agentclient.New(func(context.Context) (net.Conn, error) { return hostEnd, nil }, slog.New(slog.DiscardHandler))
	defer c.Close()
	if _, err := c.Processes(context.Background()); !errors.Is(err, errdefs.ErrDeadline) {
		t.Fatalf("processes from a silent agent: %v", err)
	}
	// A caller's own deadline is kept (and reported the same way).
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Stat(ctx, "/"); !errors.Is(err, errdefs.ErrDeadline) {
		t.Fatalf("stat with a deadline: %v", err)
	}
}

// TestAgentBinary builds the static agent, runs it in --listen mode and
// checks that it reaps orphans (it is their subreaper) without losing the
// exit statuses of its own processes.
func TestAgentBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "space-agent")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/spacesandbox/space/cmd/space-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	if b, err := exec.Command("go", "version", "-m", bin).CombinedOutput(); err != nil || !strings.Contains(string(b), "CGO_ENABLED=0") {
		t.Fatalf("go version -m: %v\n%s", err, b)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	agentCmd := exec.Command(bin, "--listen", "unix:"+sock, "--user", u.Username, "--home", dir)
	agentCmd.Stderr = os.Stderr
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		agentCmd.Process.Signal(os.Interrupt)
		agentCmd.Wait()
	})
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		for {
			conn, err := d.DialContext(ctx, "unix", sock)
			if err == nil || ctx.Err() != nil {
				return conn, err
			}
			time.Sleep(5 * time.Millisecond)
		}
	}, nil)
	defer c.Close()
	h := &harness{c: c, home: dir}
	for i := range 5 {
		r := run(t, h, agentproto.StartRequest{Cmd: []string{"/bin/sh", "-c", fmt.Sprintf("(sleep 0.1; exit 9) & exit %d", i)}})
		if r.code() != i {
			t.Fatalf("exit %+v, want code %d", r.exit, i)
		}
	}
	// The orphans exit after 100 ms; none may stay a zombie.
	time.Sleep(300 * time.Millisecond)
	for attempt := 0; ; attempt++ {
		zombies := zombiesOf(agentCmd.Process.Pid)
		if len(zombies) == 0 {
			break
		}
		if attempt > 100 {
			t.Fatalf("zombie children of the agent: %v", zombies)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func zombiesOf(ppid int) []string {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []string
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[0] == "Z" && fields[1] == fmt.Sprint(ppid) {
			out = append(out, p)
		}
	}
	return out
}

// Lossless 100 MB through an attached reader (not -short: it takes a while).
func TestHugeOutputLossless(t *testing.T) {
	if testing.Short() {
		t.Skip("100 MB")
	}
	h := newHarness(t, agent.Options{})
	const size = 100 << 20
	pid, err := h.c.Start(t.Context(), agentproto.StartRequest{Cmd: []string{"head", "-c", fmt.Sprint(size), "/dev/urandom"}})
	if err != nil {
		t.Fatal(err)
	}
	es, err := h.c.Events(t.Context(), pid, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	n, next := 0, uint64(1)
	for {
		ev, err := es.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Seq != next || ev.Type == agentproto.EventTruncated {
			t.Fatalf("event %+v, want seq %d", ev.Type, next)
		}
		next++
		n += len(ev.Data)
	}
	if n != size {
		t.Fatalf("got %d bytes, want %d", n, size)
	}
}

// BenchmarkExecTrue measures an exec round trip: start `true` and stream
// its events to the exit.
func BenchmarkExecTrue(b *testing.B) {
	h := newHarness(b, agent.Options{})
	ctx := b.Context()
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		pid, err := h.c.Start(ctx, agentproto.StartRequest{Cmd: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		es, err := h.c.Events(ctx, pid, 1, true)
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := es.Next(); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
		}
		es.Close()
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// TestRun: start and follow in one round trip gives the pid, the output
// and the exit; a start that fails is an error, not a stream.
func TestRun(t *testing.T) {
	h := newHarness(t, agent.Options{})
	pid, es, err := h.c.Run(t.Context(), agentproto.StartRequest{Shell: "echo out; echo err >&2; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Close()
	var out, errOut []byte
	var exit agentproto.Event
	for {
		ev, err := es.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case agentproto.EventStdout:
			out = append(out, ev.Data...)
		case agentproto.EventStderr:
			errOut = append(errOut, ev.Data...)
		case agentproto.EventExit:
			exit = ev
		}
	}
	if pid <= 0 || string(out) != "out\n" || string(errOut) != "err\n" || exit.ExitCode == nil || *exit.ExitCode != 3 {
		t.Fatalf("run: pid %d out %q err %q exit %+v", pid, out, errOut, exit)
	}
	// The process is known to the agent like any other.
	if p, err := h.c.Process(t.Context(), pid); err != nil || p.PID != pid {
		t.Fatalf("process %d after run: %+v %v", pid, p, err)
	}
	if _, _, err := h.c.Run(t.Context(), agentproto.StartRequest{Cmd: []string{"/no/such/binary"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("run of a missing binary: %v", err)
	}
}

// TestWarmup: the warm-up runs and leaves no process behind; processes
// that were there stay untouched.
func TestWarmup(t *testing.T) {
	h := newHarness(t, agent.Options{})
	ctx := t.Context()
	pid, err := h.c.Start(ctx, agentproto.StartRequest{Cmd: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.Warmup(ctx); err != nil {
		t.Fatalf("Warmup: %v", err)
	}
	ps, err := h.c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].PID != pid || !ps[0].Running {
		t.Fatalf("processes after the warm-up: %+v, want only the running sleep %d", ps, pid)
	}
	_ = h.c.Signal(ctx, pid, "KILL")
}

// BenchmarkStdout measures streaming a process's stdout through the agent
// and the client (host processes, no sandbox): bytes/s is the figure.
func BenchmarkStdout(b *testing.B) {
	h := newHarness(b, agent.Options{})
	const size = 64 << 20
	b.SetBytes(size)
	for i := 0; i < b.N; i++ {
		_, es, err := h.c.Run(b.Context(), agentproto.StartRequest{Cmd: []string{"python3", "-c", "import sys; b=bytes(1<<20); w=sys.stdout.buffer; [w.write(b) for _ in range(" + strconv.Itoa(size>>20) + ")]"}})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			ev, err := es.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n += len(ev.Data)
			es.Recycle(ev.Data)
		}
		es.Close()
		if n != size {
			b.Fatalf("%d bytes", n)
		}
	}
}

// TestStats: the guest's figures come over the wire, within their ranges.
func TestStats(t *testing.T) {
	h := newHarness(t, agent.Options{})
	st, err := h.c.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.CPUCount < 1 || st.CPUUsedPct < 0 || st.CPUUsedPct > 100 {
		t.Errorf("cpu: %+v", st)
	}
	if st.MemTotal <= 0 || st.MemUsed <= 0 || st.MemUsed > st.MemTotal {
		t.Errorf("memory: %+v", st)
	}
	if st.DiskTotal <= 0 || st.DiskUsed < 0 || st.DiskUsed > st.DiskTotal {
		t.Errorf("disk: %+v", st)
	}
	// Without the CPU: no measuring window, no file walk unless asked.
	ds, err := h.c.DiskStats(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if ds.CPUUsedPct != 0 || ds.LargeFiles != nil || ds.MemTotal <= 0 || ds.DiskTotal <= 0 {
		t.Errorf("disk stats: %+v", ds)
	}
}
