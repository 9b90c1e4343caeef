package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agent/agenttest"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// A server that died between answering a warm create and delivering the
// identity re-attaches an agent that never got it: confirmIdentity
// delivers it (id and env), and requests wait for that.
func TestConfirmIdentityDeliversUndelivered(t *testing.T) {
	c := agenttest.Client(t, "")
	svc := New(Config{DataDir: t.TempDir()}, nil, nil, slog.New(slog.DiscardHandler), nil)
	sb := store.Sandbox{ID: "sb-identity", Team: "t", Env: map[string]string{"TENANT": "alpha"}}
	l := &live{agent: c, ready: make(chan struct{})}
	l.opMu.Lock()
	go svc.confirmIdentity(sb, l)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !l.opMu.TryLock() {
		t.Fatal("opMu still held after the identity was confirmed")
	}
	l.opMu.Unlock()
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.SandboxID != sb.ID {
		t.Fatalf("agent sandbox id = %q, want %q", info.SandboxID, sb.ID)
	}
	out := runEnv(t, c, "TENANT")
	if out != "alpha" {
		t.Fatalf("TENANT = %q after re-delivery", out)
	}

	// An agent that has its identity is left alone: a different env in
	// the record is not pushed again.
	sb.Env = map[string]string{"TENANT": "beta"}
	l2 := &live{agent: c, ready: make(chan struct{})}
	l2.opMu.Lock()
	go svc.confirmIdentity(sb, l2)
	if err := l2.wait(ctx); err != nil {
		t.Fatal(err)
	}
	if out := runEnv(t, c, "TENANT"); out != "alpha" {
		t.Fatalf("TENANT = %q: an initialised agent was initialised again", out)
	}
}

// A re-attached sandbox whose agent does not answer is asked again until
// confirmWithin and then not trusted: its requests get an error instead
// of running without an identity it may lack, and lifecycle operations (a
// delete) go on. An agent that answers after a few failed dials gets its
// identity.
func TestConfirmIdentityUnanswered(t *testing.T) {
	defer func(d time.Duration) { confirmWithin = d }(confirmWithin)
	confirmWithin = 2 * time.Second
	svc := New(Config{DataDir: t.TempDir()}, nil, nil, slog.New(slog.DiscardHandler), nil)
	sb := store.Sandbox{ID: "sb-unanswered", Team: "t", Env: map[string]string{"TENANT": "alpha"}}
	down := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		return nil, errors.New("agent unreachable")
	}, slog.New(slog.DiscardHandler))
	defer down.Close()
	l := &live{agent: down, ready: make(chan struct{})}
	l.opMu.Lock()
	start := time.Now()
	go svc.confirmIdentity(sb, l)
	if err := l.wait(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "not confirmed") {
		t.Fatalf("requests to a sandbox whose agent never answered: %v, want unavailable", err)
	}
	if d := time.Since(start); d < confirmWithin {
		t.Errorf("gave up after %v, before confirmWithin (%v)", d, confirmWithin)
	}
	if !l.opMu.TryLock() {
		t.Fatal("opMu still held: a delete would hang")
	}
	l.opMu.Unlock()

	// Unreachable for its first dials, then up: asked again, it gets its
	// identity.
	dial := agenttest.Dialer(t, "")
	var dials atomic.Int32
	flaky := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		if dials.Add(1) <= 3 {
			return nil, errors.New("agent not up yet")
		}
		return dial(ctx)
	}, slog.New(slog.DiscardHandler))
	defer flaky.Close()
	confirmWithin = 30 * time.Second
	l2 := &live{agent: flaky, ready: make(chan struct{})}
	l2.opMu.Lock()
	go svc.confirmIdentity(sb, l2)
	if err := l2.wait(context.Background()); err != nil {
		t.Fatalf("an agent up after %d dials: %v", dials.Load(), err)
	}
	if out := runEnv(t, flaky, "TENANT"); out != "alpha" {
		t.Fatalf("TENANT = %q after a late confirmation", out)
	}
}

// Requests for a sandbox whose identity is still on its way wait for it,
// and get the delivery's error when it failed.
func TestLiveWait(t *testing.T) {
	l := &live{ready: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.wait(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("wait before delivery = %v, want unavailable", err)
	}
	l.initErr = errdefs.Unavailable("refused")
	close(l.ready)
	if err := l.wait(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("wait after a failed delivery = %v", err)
	}
	if err := (&live{}).wait(context.Background()); err != nil {
		t.Fatalf("a sandbox without a pending delivery: %v", err)
	}
}

func runEnv(t *testing.T, c *agentclient.Client, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, ev, err := c.Run(ctx, agentproto.StartRequest{Cmd: []string{"/bin/sh", "-c", "printf %s \"$" + name + "\""}})
	if err != nil {
		t.Fatal(err)
	}
	return stdoutOf(ev)
}

// A claim's identity waits while creates are in flight (the burst is
// answered first), goes at once when a request needs the sandbox, goes by
// itself when the burst ends, and never waits longer than its bound.
func TestIdentityYieldsToTheBurst(t *testing.T) {
	c := agenttest.Client(t, "")
	svc := New(Config{DataDir: t.TempDir()}, nil, nil, slog.New(slog.DiscardHandler), nil)
	defer func(d time.Duration) { identityMaxDefer = d }(identityMaxDefer)
	identityMaxDefer = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	claim := func(id string) *live {
		l := &live{agent: c, ready: make(chan struct{}), urgent: make(chan struct{})}
		l.opMu.Lock()
		go svc.deliverIdentity(store.Sandbox{ID: id}, l, agentproto.InitRequest{SandboxID: id, Env: map[string]string{}}, false)
		return l
	}
	delivered := func(l *live, within time.Duration) bool {
		select {
		case <-l.ready:
			return true
		case <-time.After(within):
			return false
		}
	}

	svc.creating.Store(1) // a create of the burst is still being answered
	l := claim("sb-burst-1")
	if delivered(l, 200*time.Millisecond) {
		t.Fatal("identity delivered while a create was in flight")
	}
	if err := l.wait(ctx); err != nil { // an exec arrives: hurry
		t.Fatal(err)
	}
	if info, err := c.Info(ctx); err != nil || info.SandboxID != "sb-burst-1" {
		t.Fatalf("after hurry: %+v %v", info, err)
	}

	l = claim("sb-burst-2")
	if delivered(l, 100*time.Millisecond) {
		t.Fatal("identity delivered while a create was in flight")
	}
	svc.lastCreate.Store(time.Now().UnixNano())
	svc.creating.Store(0) // the burst ends
	if !delivered(l, 20*time.Second) {
		t.Fatal("identity not delivered after the burst ended")
	}
	if info, err := c.Info(ctx); err != nil || info.SandboxID != "sb-burst-2" {
		t.Fatalf("after the burst: %+v %v", info, err)
	}

	identityMaxDefer = 50 * time.Millisecond
	svc.creating.Store(1) // creates never stop: the bound applies
	l = claim("sb-burst-3")
	if !delivered(l, 20*time.Second) {
		t.Fatal("identity waited past its bound")
	}
	if !l.opMu.TryLock() {
		t.Fatal("opMu still held after delivery")
	}
}
