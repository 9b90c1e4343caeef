package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runscProcs returns the pids of runsc processes whose command line names
// the data dir (every runsc the server starts gets --root under it).
func runscProcs(data string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(b), "\x00")
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.HasPrefix(filepath.Base(argv0), "runsc") && strings.Contains(cl, data) {
			out = append(out, pid)
		}
	}
	return out
}

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

func jsonString(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// commandView is one command as GET /v1/sandboxes/{id}/commands lists it.
type commandView struct {
	ID         int64
	PID        int
	Cmd        []string
	Background bool
	StartedAt  time.Time  `json:"started_at"`
	ExitCode   *int       `json:"exit_code"`
	ExitedAt   *time.Time `json:"exited_at"`
	State      string
}

// TestCommandHistory: every command started through the API is listed,
// oldest first, with how it ended, a page at a time; a background command
// nobody followed gets its end from the agent; the history outlives the
// sandbox, where an end never seen is "unknown"; another team sees none
// of it; bad pages are refused.
func TestCommandHistory(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	all := func(key string) []commandView {
		t.Helper()
		var out []commandView
		for cursor, pages := "", 0; ; pages++ {
			var page struct {
				Commands   []commandView
				NextCursor string `json:"next_cursor"`
			}
			path := "/v1/sandboxes/" + id + "/commands?limit=2"
			if cursor != "" {
				path += "&cursor=" + cursor
			}
			if code := s.do("GET", path, key, nil, &page); code != 200 {
				t.Fatalf("GET %s: %d", path, code)
			}
			if len(page.Commands) > 2 || pages > 20 {
				t.Fatalf("page of %d commands (page %d)", len(page.Commands), pages)
			}
			out = append(out, page.Commands...)
			if page.NextCursor == "" {
				return out
			}
			cursor = page.NextCursor
		}
	}
	if r := s.sh(id, "echo one"); r.ExitCode != 0 {
		t.Fatalf("echo: %+v", r)
	}
	var r execResult
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"sh", "-c", "exit 3"}}, &r); code != 200 || r.ExitCode != 3 {
		t.Fatalf("exit 3: %d %+v", code, r)
	}
	var short, long struct{ PID int }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"sleep", "1"}, "background": true}, &short); code != 200 && code != 201 && code != 202 {
		t.Fatalf("background sleep 1: %d", code)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"sleep", "600"}, "background": true}, &long); code != 200 && code != 201 && code != 202 {
		t.Fatalf("background sleep 600: %d", code)
	}
	// At once: the backgrounded ones run.
	got := all(s.key)
	if len(got) != 4 {
		t.Fatalf("commands: %+v, want 4", got)
	}
	want := []struct {
		cmd   string
		state string
		code  int
		bg    bool
	}{
		{"/bin/bash -lc echo one", "exited", 0, false},
		{"sh -c exit 3", "exited", 3, false},
		{"sleep 1", "running", 0, true},
		{"sleep 600", "running", 0, true},
	}
	check := func(got []commandView, what string) {
		t.Helper()
		for i, w := range want {
			g := got[i]
			if strings.Join(g.Cmd, " ") != w.cmd || g.State != w.state || g.Background != w.bg || g.StartedAt.IsZero() || g.PID <= 0 ||
				(w.state == "exited") != (g.ExitCode != nil && g.ExitedAt != nil) || (g.ExitCode != nil && *g.ExitCode != w.code) {
				t.Errorf("%s: command %d = %+v, want %q %s %d", what, i, g, w.cmd, w.state, w.code)
			}
			if i > 0 && g.StartedAt.Before(got[i-1].StartedAt) {
				t.Errorf("%s: command %d started before the one listed before it", what, i)
			}
		}
	}
	check(got, "right after")
	if got[2].PID != short.PID || got[3].PID != long.PID {
		t.Errorf("background pids %d %d, want %d %d", got[2].PID, got[3].PID, short.PID, long.PID)
	}
	// The short one ended unseen by any stream: the agent tells.
	want[2].state = "exited"
	waitFor(t, "the background sleep 1 to be seen exited", 30*time.Second, func() bool { return all(s.key)[2].State == "exited" })
	check(all(s.key), "after sleep 1")

	// Another team: not found, as the sandbox is.
	var e apiError
	if code := s.do("GET", "/v1/sandboxes/"+id+"/commands", s.teamKey("history-other"), nil, &e); code != 404 || e.Error != "not_found" {
		t.Errorf("another team's read: %d %+v", code, e)
	}
	for _, q := range []string{"limit=0", "limit=1001", "limit=x", "cursor=x", "cursor=-4"} {
		if code := s.do("GET", "/v1/sandboxes/"+id+"/commands?"+q, s.key, nil, &e); code != 400 || e.Error != "invalid_argument" {
			t.Errorf("?%s: %d %+v, want 400", q, code, e)
		}
	}

	// After the sandbox is gone: the same history, the ended ones kept,
	// the one still running then unknown.
	if code := s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil); code != 200 && code != 204 {
		t.Fatalf("delete: %d", code)
	}
	want[3].state = "unknown"
	check(all(s.key), "after the sandbox stopped")

	cmd := exec.Command(spaceBin(t), "commands", id)
	cmd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+s.key)
	out, err := cmd.CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)\s`+strconv.Itoa(long.PID)+`\s+unknown \(background\)\s+sleep 600$`).Match(out) ||
		!regexp.MustCompile(`(?m)\sexited 3\s+sh -c exit 3$`).Match(out) {
		t.Errorf("space commands: %v\n%s", err, out)
	}
}
