package security

import (
	"errors"
	"strings"
	"testing"
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
