package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// TestExecTag: a process tag is bounded printable text; it reaches the
// agent's start request.
func TestExecTag(t *testing.T) {
	for _, tc := range []struct {
		tag string
		ok  bool
	}{
		{"", true},
		{"worker", true},
		{`space.e2b-context:{"id":"ab","language":"python","cwd":"/tmp/é"}`, true},
		{strings.Repeat("x", maxTagBytes), true},
		{strings.Repeat("x", maxTagBytes+1), false},
		{"a\nb", false},
		{"a\x00b", false},
		{"\xff", false},
	} {
		r := ExecRequest{Cmd: []string{"true"}, Tag: tc.tag}
		err := r.validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("tag %q: %v, want ok=%v", tc.tag, err, tc.ok)
		}
		if tc.ok && r.agentRequest().Tag != tc.tag {
			t.Errorf("tag %q not passed to the agent", tc.tag)
		}
	}
}

// TestRecordedCmdCapped: the history's record of a command (what the
// process log holds until written) is capped, a shell command too.
func TestRecordedCmdCapped(t *testing.T) {
	for _, r := range []ExecRequest{
		{Shell: strings.Repeat("x", maxArgBytes)},
		{Cmd: []string{"echo", strings.Repeat("y", maxArgBytes-4)}},
	} {
		if err := r.validate(); err != nil {
			t.Fatal(err)
		}
		cmd := r.recordedCmd()
		n := 0
		for _, a := range cmd {
			n += len(a) + 1
		}
		if n > store.MaxCmdBytes || !strings.HasSuffix(cmd[len(cmd)-1], store.CmdTruncated) {
			t.Errorf("recorded %d bytes in %d arguments; want at most %d, marked", n, len(cmd), store.MaxCmdBytes)
		}
	}
	if cmd := (ExecRequest{Shell: "ls"}).recordedCmd(); strings.Join(cmd, " ") != "/bin/bash -lc ls" {
		t.Errorf("short shell command recorded as %q", cmd)
	}
}
