package sandbox

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
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
// line on its stdin, once (a later Init, as a fork's child gets, sends
// nothing); not kept, it is killed and no longer listed. A process
// started without InitStdin is left alone either way.
func TestPrestartedSettledAtInit(t *testing.T) {
	ctx := context.Background()
	script := `read a; echo "first $a"; read b; echo "second $b"`
	start := func(c *agentclient.Client, initStdin bool) int {
		t.Helper()
		pid, err := c.Start(ctx, agentproto.StartRequest{Cmd: []string{"/bin/sh", "-c", script}, Stdin: true, InitStdin: initStdin})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}

	kept := hostAgent(t)
	pre, other := start(kept, true), start(kept, false)
	env := map[string]string{"TENANT": "alpha"}
	// An Init without an identity (a pool sandbox restored from its
	// image gets one with the clock and entropy) settles nothing.
	if err := kept.Init(ctx, agentproto.InitRequest{Entropy: []byte("0123456789abcdef")}); err != nil {
		t.Fatal(err)
	}
	if err := kept.Init(ctx, agentproto.InitRequest{SandboxID: "sb-1", Env: env, KeepPrestarted: true}); err != nil {
		t.Fatal(err)
	}
	// A second Init (a fork's child gets one) sends nothing more.
	if err := kept.Init(ctx, agentproto.InitRequest{SandboxID: "sb-2", Env: env, KeepPrestarted: true}); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{pre, other} {
		if err := kept.Stdin(ctx, pid, strings.NewReader(""), true); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := output(t, kept, pre), "first {\"init\":{\"env\":{\"TENANT\":\"alpha\"}}}\nsecond \n"; got != want {
		t.Errorf("kept prestarted process printed %q, want %q", got, want)
	}
	if got := output(t, kept, other); got != "first \nsecond \n" {
		t.Errorf("a process started without init_stdin printed %q: it was written to", got)
	}

	dropped := hostAgent(t)
	pre, other = start(dropped, true), start(dropped, false)
	if err := dropped.Init(ctx, agentproto.InitRequest{SandboxID: "sb-3", Env: env}); err != nil {
		t.Fatal(err)
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

	// init_stdin needs a stdin to write to.
	_, err := dropped.Start(ctx, agentproto.StartRequest{Cmd: []string{"true"}, InitStdin: true})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("init_stdin without stdin: %v, want invalid argument", err)
	}
}
