package sandbox

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/store"
)

// TestCauseText: a snapshot's cause shows a shell command as typed and an
// argv joined, and a long one cut on a character boundary.
func TestCauseText(t *testing.T) {
	if got := causeText([]string{"/bin/bash", "-lc", "echo hi > f"}); got != "echo hi > f" {
		t.Errorf("shell command: %q", got)
	}
	if got := causeText([]string{"python3", "-c", "print(1)"}); got != "python3 -c print(1)" {
		t.Errorf("argv: %q", got)
	}
	long := strings.Repeat("é", store.MaxCauseBytes) // 2 bytes each
	got := causeText([]string{"/bin/bash", "-lc", long})
	if len(got) > store.MaxCauseBytes || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || !strings.HasPrefix(long, strings.TrimSuffix(got, "…")) {
		t.Errorf("long command cut to %d bytes: %q", len(got), got)
	}
}
