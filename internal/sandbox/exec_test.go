package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
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
