package security

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	space "github.com/spacesandbox/space/sdk/go"
)

func TestDecide(t *testing.T) {
	p := Probe{ID: "x"}
	cases := []struct {
		name string
		e    Evidence
		want string
	}{
		{"canary hit wins over BLOCKED", Evidence{Probe: p, Stdout: "BLOCKED: 403\n", Hits: []string{"tcp"}}, Bypassed},
		{"token in output", Evidence{Probe: p, Token: "tok", Stdout: "BLOCKED: got tok\n"}, Bypassed},
		{"script bypass", Evidence{Probe: p, Stdout: "BLOCKED: a\nBYPASS: b\n"}, Bypassed},
		{"all blocked", Evidence{Probe: p, Token: "tok", Stdout: "BLOCKED: a\nBLOCKED: b\n"}, Blocked},
		{"an error hides the rest", Evidence{Probe: p, Token: "tok", Stdout: "BLOCKED: a\nERROR: NameError\n"}, Error},
		{"no verdict", Evidence{Probe: p, Token: "tok", Stdout: "Traceback...\n", ExitCode: 1}, Error},
		{"exec failed", Evidence{Probe: p, Token: "tok", ExecErr: errors.New("exec: timeout"), Stdout: "BLOCKED: a\n"}, Error},
	}
	for _, c := range cases {
		if got, d := decide(&c.e); got != c.want {
			t.Errorf("%s: %s (%s), want %s", c.name, got, d, c.want)
		}
	}
}

func TestInPolicy(t *testing.T) {
	pol := []string{"allowed.test:8443", "api.test"}
	for _, c := range []struct {
		host string
		port int
		want bool
	}{{"allowed.test", 8443, true}, {"allowed.test", 443, false}, {"api.test", 443, true}, {"api.test", 22, false}, {"other.test", 8443, false}} {
		if got := inPolicy(c.host, c.port, pol); got != c.want {
			t.Errorf("inPolicy(%s:%d) = %v", c.host, c.port, got)
		}
	}
}

func TestProbesWellFormed(t *testing.T) {
	seen := map[string]bool{}
	ps := Probes()
	if len(ps) < 28 {
		t.Errorf("%d probes, want >= 28", len(ps))
	}
	for _, p := range ps {
		if seen[p.ID] || p.ID == "" || p.Name == "" || p.Technique == "" || (p.Python == "") == (p.Shell == "") {
			t.Errorf("bad probe %+v", p.ID)
		}
		seen[p.ID] = true
	}
	rep := &Report{Results: []Result{{ID: "a", Result: Blocked}}, Probes: 1}
	if !strings.HasSuffix(rep.Table(), "\n1 probes, 0 bypassed\n") {
		t.Errorf("table: %q", rep.Table())
	}
}

// fakeTarget records the probe secret's life; its sandbox create fails
// when failCreate is set, and its execs always fail.
type fakeTarget struct {
	failCreate bool
	cancel     context.CancelFunc // called at the create: the run's ctx ends mid-run

	mu          sync.Mutex
	put, bound  string
	deleted     []string
	deleteCtxOK bool
}

func (f *fakeTarget) PutSecret(ctx context.Context, req space.PutSecretRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.put = req.Name
	return nil
}

func (f *fakeTarget) DeleteSecret(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, name)
	f.deleteCtxOK = ctx.Err() == nil
	return nil
}

func (f *fakeTarget) CreateSandbox(ctx context.Context, allow, secrets []string) (string, error) {
	f.mu.Lock()
	f.bound = strings.Join(secrets, ",")
	f.mu.Unlock()
	if f.cancel != nil {
		f.cancel()
	}
	if f.failCreate {
		return "", errors.New("no sandbox")
	}
	return "sb-fake", nil
}

func (f *fakeTarget) Exec(ctx context.Context, id string, req space.ExecRequest) (*space.ExecResult, error) {
	return nil, errors.New("no exec")
}

func (f *fakeTarget) EgressLog(ctx context.Context, id string) ([]space.EgressRecord, error) {
	return nil, nil
}

func (f *fakeTarget) Destroy(ctx context.Context, id string) error { return nil }

// TestProbeSecretCleanedUp: each run stores a secret of its own name (not
// SecretName, which replaced a team secret of that name) and deletes it
// when done, on a context still alive, also when the run fails or its
// context ended.
func TestProbeSecretCleanedUp(t *testing.T) {
	var names []string
	for _, failCreate := range []bool{true, false} {
		ctx, cancel := context.WithCancel(t.Context())
		f := &fakeTarget{failCreate: failCreate, cancel: cancel}
		_, err := Run(ctx, f, Options{Request: Request{Only: []string{"dns-getent"}}})
		cancel()
		if (err != nil) != failCreate {
			t.Fatalf("run (create fails: %v): %v", failCreate, err)
		}
		if !strings.HasPrefix(f.put, SecretName+"_") || f.bound != f.put {
			t.Errorf("secret stored as %q, bound %q; want %s_<random>, bound", f.put, f.bound, SecretName)
		}
		if len(f.deleted) != 1 || f.deleted[0] != f.put || !f.deleteCtxOK {
			t.Errorf("deleted %q (context alive: %v), want %q once", f.deleted, f.deleteCtxOK, f.put)
		}
		names = append(names, f.put)
	}
	if names[0] == names[1] {
		t.Errorf("two runs stored the same secret %q", names[0])
	}
}
