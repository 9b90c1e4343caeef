package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCLI runs the README's walkthrough with the real `space` binary
// against a real server.
func TestCLI(t *testing.T) {
	s := sharedServer(t)
	run := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(spaceBin(t), args...)
		cmd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+s.key)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("space %v: %v", args, err)
		}
		return out.String(), errb.String(), code
	}
	out, errOut, code := run("", "create")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sb-") {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	out, _, code = run("", "exec", id, "--", "python3", "-c", "print(sum(range(10)))")
	if code != 0 || out != "45\n" {
		t.Errorf("exec: %d %q", code, out)
	}
	_, _, code = run("", "exec", id, "--", "sh", "-c", "exit 9")
	if code != 9 {
		t.Errorf("exit code: %d", code)
	}
	_, errOut, code = run("", "exec", id, "--", "no-such-program")
	if code != 127 || !strings.Contains(errOut, "no-such-program") {
		t.Errorf("missing program: %d %q", code, errOut)
	}
	dir := t.TempDir()
	local := filepath.Join(dir, "data.csv")
	os.WriteFile(local, []byte("a,b\n1,2\n"), 0o644)
	if _, errOut, code = run("", "cp", local, id+":/home/user/data.csv"); code != 0 {
		t.Fatalf("cp up: %d %s", code, errOut)
	}
	run("", "exec", id, "--", "sh", "-c", "tr a-z A-Z < data.csv > out.csv")
	if _, errOut, code = run("", "cp", id+":/home/user/out.csv", dir); code != 0 {
		t.Fatalf("cp down: %d %s", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "out.csv")); string(b) != "A,B\n1,2\n" {
		t.Errorf("downloaded %q", b)
	}
	// A link's own mode (0777) is not given to the local copy of its target.
	run("", "exec", id, "--", "ln", "-s", "/home/user/out.csv", "/home/user/link.csv")
	if _, errOut, code = run("", "cp", id+":/home/user/link.csv", filepath.Join(dir, "link.csv")); code != 0 {
		t.Fatalf("cp down a link: %d %s", code, errOut)
	}
	if fi, err := os.Stat(filepath.Join(dir, "link.csv")); err != nil || fi.Mode().Perm()&0o022 != 0 {
		t.Errorf("the copy of a link's target: %v %v (want no group/other write)", fi.Mode(), err)
	}
	// Binary input to --stdin is refused, not mangled into U+FFFD.
	if _, errOut, code = run("\xff\xfe binary", "exec", id, "--stdin", "--", "cat"); code == 0 || !strings.Contains(errOut, "UTF-8") {
		t.Errorf("exec --stdin with binary input: %d %q", code, errOut)
	}
	out, _, _ = run("", "ls", id+":/home/user")
	if !strings.Contains(out, "data.csv") || !strings.Contains(out, "out.csv") {
		t.Errorf("ls: %q", out)
	}
	if _, errOut, code = run("", "cp", "--user", "root", local, id+":/home/user/rootcopy/data.csv"); code != 0 {
		t.Fatalf("cp --user root: %d %s", code, errOut)
	}
	if out, _, _ = run("", "exec", id, "--", "stat", "-c", "%U", "/home/user/rootcopy", "/home/user/rootcopy/data.csv"); out != "root\nroot\n" {
		t.Errorf("owners after cp --user root: %q", out)
	}
	out, _, code = run("", "exec", id, "--background", "--", "sh", "-c", "echo started; sleep 0.3; echo done")
	pid := strings.TrimSpace(out)
	if code != 0 || pid == "" {
		t.Fatalf("background: %d %q", code, out)
	}
	out, _, _ = run("", "ps", id)
	if !strings.Contains(out, pid) {
		t.Errorf("ps lacks %s: %q", pid, out)
	}
	out, _, code = run("", "logs", id, pid, "--follow")
	if code != 0 || out != "started\ndone\n" {
		t.Errorf("logs --follow: %d %q", code, out)
	}
	out, _, _ = run("", "list")
	if !strings.Contains(out, id) {
		t.Errorf("list lacks %s: %q", id, out)
	}
	out, errOut, code = run("", "metrics", id)
	if code != 0 || !regexp.MustCompile(`(?m)^cpu +[0-9.]+% of 1\nmemory +[0-9.]+[KMG]iB of [0-9.]+[KMG]iB \(cache [0-9.]+[KMG]?i?B\)\ndisk +[0-9.]+[KMG]?i?B of [0-9.]+[KMGT]iB\n$`).MatchString(out) {
		t.Errorf("metrics: %d %q %q", code, out, errOut)
	}
	if _, errOut, code = run("", "metrics", "sb-nope"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("metrics of an unknown sandbox: %d %q", code, errOut)
	}
	if _, errOut, code = run("", "kill", id); code != 0 {
		t.Errorf("kill: %d %s", code, errOut)
	}
	out, _, _ = run("", "list")
	if strings.Contains(out, id) {
		t.Errorf("killed sandbox still listed: %q", out)
	}
	out, _, _ = run("", "template", "list")
	if !strings.Contains(out, "base") {
		t.Errorf("template list: %q", out)
	}
	// Quotas: set, shown with the team's use, enforced, reset.
	out, errOut, code = run("", "quota", "set", "cli-quota", "--max-sandboxes", "1", "--max-cpu", "4", "--max-snapshot-mb", "100")
	if code != 0 || out != "team      cli-quota (team quota)\nsandboxes 0 of 1\nmemory    0 MiB of no limit\ncpu       0 of 4\ndisk      0 MiB of no limit\nsnapshots 0 MiB of 100 MiB\nrequests  no limit\n" {
		t.Errorf("quota set: %d %q %q", code, out, errOut)
	}
	teamKey := s.teamKey("cli-quota")
	s.do("POST", "/v1/sandboxes", teamKey, map[string]any{}, nil)
	cmd := exec.Command(spaceBin(t), "create")
	cmd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+teamKey)
	if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), "1 sandboxes") {
		t.Errorf("create past the quota: %v %q", err, b)
	}
	out, _, _ = run("", "quota", "get", "cli-quota", "--json")
	var q quotaView
	if err := json.Unmarshal([]byte(out), &q); err != nil || q.Usage.Sandboxes != 1 || q.Usage.CPU != 1 || q.MaxSandboxes != 1 || q.MaxCPU != 4 || q.MaxSnapshotMB != 100 {
		t.Errorf("quota get --json: %q %v", out, err)
	}
	if _, errOut, code = run("", "quota", "reset", "cli-quota"); code != 0 {
		t.Errorf("quota reset: %d %q", code, errOut)
	}
	if _, errOut, code = run("", "quota", "set", "cli-quota"); code == 0 || !strings.Contains(errOut, "--max-sandboxes") {
		t.Errorf("quota set without a limit: %d %q", code, errOut)
	}
	var list struct{ Sandboxes []sandboxView }
	s.do("GET", "/v1/sandboxes", teamKey, nil, &list)
	for _, sb := range list.Sandboxes {
		s.do("DELETE", "/v1/sandboxes/"+sb.ID, teamKey, nil, nil)
	}
}

// TestCLISnapshots runs the snapshot walkthrough of the README with the
// real binary: pause/resume, snapshot, snapshots, fork, diff, restore,
// create --from-snapshot.
func TestCLISnapshots(t *testing.T) {
	s := sharedServer(t)
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(spaceBin(t), args...)
		cmd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+s.key)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return out.String(), code
	}
	out, _ := run("create")
	id := strings.TrimSpace(out)
	run("exec", id, "--", "sh", "-c", "echo v1 > /home/user/report.csv")
	if out, code := run("pause", id); code != 0 || !strings.Contains(out, "paused") {
		t.Fatalf("pause: %d %q", code, out)
	}
	if out, code := run("resume", id); code != 0 || !strings.Contains(out, "running") {
		t.Fatalf("resume: %d %q", code, out)
	}
	out, code := run("snapshot", id, "--name", "before-cleanup", "-q")
	a := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(a, "snap-") {
		t.Fatalf("snapshot: %d %q", code, out)
	}
	run("exec", id, "--", "sh", "-c", "echo v2 > /home/user/report.csv")
	out, _ = run("snapshot", id, "--files", "-q")
	b := strings.TrimSpace(out)
	if out, _ := run("snapshots", id); !strings.Contains(out, a) || !strings.Contains(out, b) || !strings.Contains(out, "before-cleanup") {
		t.Errorf("snapshots: %q", out)
	}
	if out, _ := run("diff", id, a, b); !strings.Contains(out, "M /home/user/report.csv") {
		t.Errorf("diff: %q", out)
	}
	if out, code := run("restore", id, "--snapshot", a, "/home/user/report.csv"); code != 0 {
		t.Errorf("restore: %d %q", code, out)
	}
	if out, _ := run("exec", id, "--", "cat", "/home/user/report.csv"); out != "v1\n" {
		t.Errorf("after restore: %q", out)
	}
	out, code = run("fork", id, "--count", "2")
	kids := strings.Fields(out)
	if code != 0 || len(kids) != 2 {
		t.Fatalf("fork: %d %q", code, out)
	}
	out, code = run("create", "--from-snapshot", a)
	c := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(c, "sb-") {
		t.Fatalf("create --from-snapshot: %d %q", code, out)
	}
	if out, _ := run("exec", c, "--", "cat", "/home/user/report.csv"); out != "v1\n" {
		t.Errorf("sandbox from snapshot: %q", out)
	}
	run("kill", id, c, kids[0], kids[1])
}
