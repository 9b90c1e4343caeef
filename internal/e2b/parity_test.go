package e2b

import (
	"net/url"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/store"
)

// connect only ever extends: a timeout ending before the current end time
// (or a sandbox that never expires) is left as it is.
func TestConnectExtends(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	hour := store.Sandbox{ExpiresAt: now.Add(time.Hour)}
	for _, c := range []struct {
		sb      store.Sandbox
		timeout int
		want    bool
	}{
		{hour, 300, false},
		{hour, 3600, false},
		{hour, 3601, true},
		{store.Sandbox{}, 300, false},
		{store.Sandbox{ExpiresAt: now.Add(-time.Minute)}, 1, true},
	} {
		if got := extends(c.sb, c.timeout, now); got != c.want {
			t.Errorf("end %v, timeout %d s: extends %v, want %v", c.sb.ExpiresAt, c.timeout, got, c.want)
		}
	}
}

// E2B lists newest first unless order=asc.
func TestListQueryOrder(t *testing.T) {
	for q, desc := range map[string]bool{"": true, "order=desc": true, "order=asc": false} {
		v, _ := url.ParseQuery(q)
		lq, err := parseListQuery(v)
		if err != nil || lq.desc != desc {
			t.Errorf("%q: desc %v, %v; want %v", q, lq.desc, err, desc)
		}
	}
	if _, err := parseListQuery(url.Values{"order": {"sideways"}}); err == nil {
		t.Error("order=sideways accepted")
	}
}

// A link's symlinkTarget is absolute, as envd's.
func TestSymlinkTargetAbsolute(t *testing.T) {
	for target, want := range map[string]string{"t.txt": "/tmp/ln/t.txt", "../x/y": "/tmp/x/y", "/etc/hosts": "/etc/hosts", "./a/../b": "/tmp/ln/b"} {
		e := entryInfo(agentproto.FileInfo{Path: "/tmp/ln/l", Type: "symlink", Target: target})
		if e.SymlinkTarget == nil || *e.SymlinkTarget != want {
			t.Errorf("link to %q: symlinkTarget %v, want %q", target, e.SymlinkTarget, want)
		}
	}
}
