package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func TestBadInput(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	countSandboxes := func() int {
		var list struct{ Sandboxes []sandboxView }
		s.do("GET", "/v1/sandboxes?state=creating,running,paused,stopping,stopped,error", s.key, nil, &list)
		return len(list.Sandboxes)
	}
	ckpt := s.snapshot(id, "checkpoint", "").ID
	before := countSandboxes()
	big := `{"template":"base","metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`
	cases := []struct {
		name, method, path, key string
		body                    any
		status                  int
		code                    string
	}{
		{"malformed JSON", "POST", "/v1/sandboxes", s.key, `{"template": "base",`, 400, "invalid_argument"},
		{"not an object", "POST", "/v1/sandboxes", s.key, `[1,2]`, 400, "invalid_argument"},
		{"unknown field", "POST", "/v1/sandboxes", s.key, `{"tempalte":"base"}`, 400, "invalid_argument"},
		{"unknown template", "POST", "/v1/sandboxes", s.key, `{"template":"no-such-template"}`, 404, "not_found"},
		{"bad template name", "POST", "/v1/sandboxes", s.key, `{"template":"../etc"}`, 400, "invalid_argument"},
		{"negative memory", "POST", "/v1/sandboxes", s.key, `{"memory_mb":-5}`, 400, "invalid_argument"},
		{"huge cpu", "POST", "/v1/sandboxes", s.key, `{"cpu":1000}`, 400, "invalid_argument"},
		{"bad env name", "POST", "/v1/sandboxes", s.key, `{"env":{"A=B":"x"}}`, 400, "invalid_argument"},
		{"oversized body", "POST", "/v1/sandboxes", s.key, big, 413, "too_large"},
		{"no key", "GET", "/v1/sandboxes", "", nil, 401, "unauthenticated"},
		{"wrong key", "GET", "/v1/sandboxes", "sk_space_wrong", nil, 401, "unauthenticated"},
		{"unknown id", "GET", "/v1/sandboxes/sb-aaaaaaaaaaaaaaaa", s.key, nil, 404, "not_found"},
		{"garbage id", "DELETE", "/v1/sandboxes/..%2F..%2Fetc", s.key, nil, 404, "not_found"},
		{"path traversal read", "GET", "/v1/sandboxes/" + id + "/files?path=/home/user/../../etc/passwd", s.key, nil, 400, "invalid_argument"},
		{"path traversal write", "PUT", "/v1/sandboxes/" + id + "/files?path=../x", s.key, "data", 400, "invalid_argument"},
		{"NUL in path", "GET", "/v1/sandboxes/" + id + "/files/stat?path=/tmp/a%00b", s.key, nil, 400, "invalid_argument"},
		{"missing path", "GET", "/v1/sandboxes/" + id + "/files", s.key, nil, 400, "invalid_argument"},
		{"read missing file", "GET", "/v1/sandboxes/" + id + "/files?path=/nope", s.key, nil, 404, "not_found"},
		{"empty cmd", "POST", "/v1/sandboxes/" + id + "/exec", s.key, `{"cmd":[]}`, 400, "invalid_argument"},
		{"cmd wrong type", "POST", "/v1/sandboxes/" + id + "/exec", s.key, `{"cmd":42}`, 400, "invalid_argument"},
		{"bad pid", "POST", "/v1/sandboxes/" + id + "/processes/abc/signal", s.key, `{"signal":"SIGTERM"}`, 400, "invalid_argument"},
		{"bad depth", "GET", "/v1/sandboxes/" + id + "/files/list?path=/&depth=99", s.key, nil, 400, "invalid_argument"},
		{"bad timeout", "POST", "/v1/sandboxes/" + id + "/timeout", s.key, `{"timeout_s":0}`, 400, "invalid_argument"},
		{"bad state filter", "GET", "/v1/sandboxes?state=flying", s.key, nil, 400, "invalid_argument"},
		// A timeout that overflows a duration used to expire at once (or in 1734).
		{"overflowing timeout", "POST", "/v1/sandboxes", s.key, `{"timeout_s":9223372037}`, 400, "invalid_argument"},
		{"overflowing timeout reset", "POST", "/v1/sandboxes/" + id + "/timeout", s.key, `{"timeout_s":18446744074}`, 400, "invalid_argument"},
		// A create from a checkpoint used to ignore what it could not apply.
		{"checkpoint create with network", "POST", "/v1/sandboxes", s.key, `{"snapshot":"` + ckpt + `","network":{"allow":["*"]}}`, 400, "invalid_argument"},
		{"checkpoint create bad on_timeout", "POST", "/v1/sandboxes", s.key, `{"snapshot":"` + ckpt + `","on_timeout":"bogus"}`, 400, "invalid_argument"},
		{"checkpoint create bad metadata", "POST", "/v1/sandboxes", s.key, `{"snapshot":"` + ckpt + `","metadata":{"a b":"x"}}`, 400, "invalid_argument"},
		{"checkpoint create other driver", "POST", "/v1/sandboxes", s.key, `{"snapshot":"` + ckpt + `","driver":"nonexistent"}`, 400, "invalid_argument"},
		// A FIFO or a device is not read (a FIFO held the request forever).
		{"read a device", "GET", "/v1/sandboxes/" + id + "/files?path=/dev/zero", s.key, nil, 400, "invalid_argument"},
		{"unknown route", "GET", "/v1/nothing", s.key, nil, 404, "not_found"},
		// A team key of the admin team would see the admin's sandboxes.
		{"team key for the admin team", "POST", "/v1/keys", s.key, `{"team":"admin"}`, 400, "invalid_argument"},
		// A bare null decoded into the zero request and created a sandbox.
		{"null body", "POST", "/v1/sandboxes", s.key, `null`, 400, "invalid_argument"},
		{"wrong method", "PATCH", "/v1/sandboxes/" + id, s.key, `{}`, 405, "method_not_allowed"},
		// A terminal without a WebSocket handshake answered in plain text.
		{"pty without upgrade", "GET", "/v1/sandboxes/" + id + "/pty", s.key, nil, 426, "upgrade_required"},
		{"* with other allow entries", "POST", "/v1/sandboxes", s.key, `{"network":{"allow":["*","example.com"]}}`, 400, "invalid_argument"},
		{"quota of a bad team name", "PUT", "/v1/teams/A%20B/quota", s.key, `{"max_sandboxes":1}`, 400, "invalid_argument"},
		{"negative quota", "PUT", "/v1/teams/qt/quota", s.key, `{"max_sandboxes":-1}`, 400, "invalid_argument"},
		{"empty quota", "PUT", "/v1/teams/qt/quota", s.key, `{}`, 400, "invalid_argument"},
		{"no quota to delete", "DELETE", "/v1/teams/qt/quota", s.key, nil, 404, "not_found"},
		// /dev/null became a regular file anyone could read.
		{"write over a device", "PUT", "/v1/sandboxes/" + id + "/files?path=/dev/null", s.key, "data", 400, "invalid_argument"},
		{"egress log limit not a number", "GET", "/v1/sandboxes/" + id + "/egress?limit=abc", s.key, nil, 400, "invalid_argument"},
		{"write to a path ending in /", "PUT", "/v1/sandboxes/" + id + "/files?path=/home/user/dir/", s.key, "data", 400, "invalid_argument"},
		// An unknown template answered 200 and an SSE error event.
		{"build an unknown template", "POST", "/v1/templates/no-such/build", s.key, nil, 404, "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.t = t
			var e apiError
			code := s.do(c.method, c.path, c.key, c.body, &e)
			if code != c.status || e.Code != c.status || e.Error != c.code || e.Message == "" {
				t.Errorf("got %d %+v, want %d %s", code, e, c.status, c.code)
			}
		})
	}
	s.t = t
	// An upload shorter than its Content-Length answered 500.
	host := strings.TrimPrefix(s.url, "http://")
	if c, err := net.Dial("tcp", host); err != nil {
		t.Error(err)
	} else {
		fmt.Fprintf(c, "PUT /v1/sandboxes/%s/files?path=/home/user/short HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n0123456789", id, host, s.key)
		c.(*net.TCPConn).CloseWrite()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 400 {
			t.Errorf("short upload: %v %v", resp, err)
		}
		c.Close()
	}
	if r := s.sh(id, "test -e /home/user/short && echo written; test -c /dev/null && echo device"); r.Stdout != "device\n" {
		t.Errorf("after the bad uploads: %q", r.Stdout)
	}
	if after := countSandboxes(); after != before {
		t.Errorf("sandboxes before %d, after %d: bad input changed state", before, after)
	}
	if r := s.sh(id, "echo still fine"); r.Stdout != "still fine\n" {
		t.Errorf("sandbox after bad input: %+v", r)
	}
}

func TestTenants(t *testing.T) {
	s := sharedServer(t)
	mine := s.create(nil)
	var k1, k2 struct{ Key, Team, ID string }
	if code := s.do("POST", "/v1/keys", s.key, map[string]string{"team": "alpha"}, &k1); code != 201 || !strings.HasPrefix(k1.Key, "sk_space_") {
		t.Fatalf("create key: %d %+v", code, k1)
	}
	s.do("POST", "/v1/keys", s.key, map[string]string{"team": "beta"}, &k2)
	// A team key cannot manage keys.
	var e apiError
	if code := s.do("POST", "/v1/keys", k1.Key, map[string]string{"team": "gamma"}, &e); code != 403 {
		t.Errorf("team key created a key: %d", code)
	}
	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes", k1.Key, map[string]any{}, &sb); code != 201 {
		t.Fatalf("alpha create: %d", code)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/" + sb.ID},
		{"DELETE", "/v1/sandboxes/" + sb.ID},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec"},
		{"GET", "/v1/sandboxes/" + sb.ID + "/files?path=/etc/hostname"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/timeout"},
	} {
		var body any
		if c.method == "POST" {
			body = map[string]any{"cmd": "true", "timeout_s": 10}
			if strings.HasSuffix(c.path, "timeout") {
				body = map[string]any{"timeout_s": 10}
			}
		}
		if code := s.do(c.method, c.path, k2.Key, body, &e); code != 404 {
			t.Errorf("beta %s %s on alpha's sandbox: %d, want 404", c.method, c.path, code)
		}
	}
	var list struct{ Sandboxes []sandboxView }
	s.do("GET", "/v1/sandboxes", k2.Key, nil, &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("beta lists %d sandboxes", len(list.Sandboxes))
	}
	s.do("GET", "/v1/sandboxes", k1.Key, nil, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Errorf("alpha lists %+v", list.Sandboxes)
	}
	if code := s.do("GET", "/v1/sandboxes/"+mine, k1.Key, nil, &e); code != 404 {
		t.Errorf("alpha sees admin's sandbox: %d", code)
	}
	// Still alive after beta's attempts.
	if code := s.do("GET", "/v1/sandboxes/"+sb.ID, k1.Key, nil, &sb); code != 200 || sb.State != "running" {
		t.Errorf("alpha's sandbox after beta's attempts: %d %+v", code, sb)
	}
	// A deleted key stops working.
	if code := s.do("DELETE", "/v1/keys/"+k2.ID, s.key, nil, nil); code != 204 {
		t.Errorf("delete key: %d", code)
	}
	if code := s.do("GET", "/v1/sandboxes", k2.Key, nil, &e); code != 401 {
		t.Errorf("deleted key: %d", code)
	}
}

func TestPTY(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	wsURL := strings.Replace(s.url, "http://", "ws://", 1) + "/v1/sandboxes/" + id + "/pty?cols=100&rows=30&cmd=/bin/bash"
	conn, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + s.key}}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var screen strings.Builder
	readUntil := func(want string) {
		t.Helper()
		for !strings.Contains(screen.String(), want) {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				t.Fatalf("waiting for %q: %v; screen so far %q", want, err, screen.String())
			}
			if typ == websocket.MessageBinary {
				screen.Write(data)
			} else {
				screen.WriteString("\x00" + string(data))
			}
		}
	}
	conn.Write(ctx, websocket.MessageBinary, []byte("stty size; echo MARK$((6*7))\n"))
	readUntil("MARK42")
	if !strings.Contains(screen.String(), "30 100") {
		t.Errorf("initial size not applied: %q", screen.String())
	}
	resize, _ := json.Marshal(map[string]any{"type": "resize", "cols": 120, "rows": 40})
	if err := conn.Write(ctx, websocket.MessageText, resize); err != nil {
		t.Fatal(err)
	}
	// The server applies a resize before it reads the next message, yet a
	// command right after it saw the old size about once in 40 runs on a
	// loaded host (the agent's resize had answered): ask until it shows,
	// within the test's minute.
	for i := 0; !strings.Contains(screen.String(), "40 120"); i++ {
		conn.Write(ctx, websocket.MessageBinary, []byte(fmt.Sprintf("stty size; echo SIZE%d$((6*7))\n", i)))
		readUntil(fmt.Sprintf("SIZE%d42", i))
	}
	conn.Write(ctx, websocket.MessageBinary, []byte("tty; exit 3\n"))
	readUntil(`"exit_code":3`)
	if !strings.Contains(screen.String(), "/dev/pts/") {
		t.Errorf("after resize: %q", screen.String())
	}
}

func TestTimeoutExpiry(t *testing.T) {
	s := sharedServer(t)
	id := s.create(map[string]any{"timeout_s": 2})
	var sb sandboxView
	waitFor(t, "sandbox to time out", 60*time.Second, func() bool {
		s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb)
		return sb.State == "stopped"
	})
	if sb.Reason != "timeout" {
		t.Errorf("reason %q", sb.Reason)
	}
	// Extending a live sandbox's timeout keeps it alive.
	id2 := s.create(map[string]any{"timeout_s": 2})
	if code := s.do("POST", "/v1/sandboxes/"+id2+"/timeout", s.key, map[string]int{"timeout_s": 600}, &sb); code != 200 {
		t.Fatalf("set timeout: %d", code)
	}
	time.Sleep(3 * time.Second) // past the original 2 s expiry
	s.do("GET", "/v1/sandboxes/"+id2, s.key, nil, &sb)
	if sb.State != "running" {
		t.Errorf("extended sandbox is %s", sb.State)
	}
}

// A sandbox whose timeout pauses it, resumed at once, gets a new timeout
// period and pauses again when it ends (a resume racing the reaper's pause
// used to leave it with no expiry at all: running forever).
func TestTimeoutPauseResume(t *testing.T) {
	s := sharedServer(t)
	id := s.create(map[string]any{"timeout_s": 2, "on_timeout": "pause"})
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	var sb sandboxView
	for round := 1; round <= 2; round++ {
		deadline := time.Now().Add(time.Minute)
		for {
			if code := s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); code != 200 {
				t.Fatalf("get: %d", code)
			}
			if sb.State == "paused" {
				break
			}
			if sb.State != "running" || time.Now().After(deadline) {
				t.Fatalf("round %d: not paused by its timeout: %+v", round, sb)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if code := s.do("POST", "/v1/sandboxes/"+id+"/resume", s.key, nil, &sb); code != 200 {
			t.Fatalf("round %d: resume: %d", round, code)
		}
		if code := s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); code != 200 || sb.State != "running" || !sb.ExpiresAt.After(time.Now()) {
			t.Fatalf("round %d: after resume: %d %+v", round, code, sb)
		}
	}
}

// The host directory that holds the agent's socket is read-only inside the
// sandbox, even for root: root there could otherwise fill the host's disk
// past the sandbox's disk limit, plant links and FIFOs for the host, or
// replace the socket and cut the sandbox's control channel.
func TestRunDirReadOnly(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	var r execResult
	script := "for op in 'touch /.space/run/x' 'rm -f /.space/run/agent.sock' 'ln -s /etc /.space/run/l' 'mkfifo /.space/run/f'; do sh -c \"$op\" 2>/dev/null && echo \"ALLOWED: $op\"; done; echo done"
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": script, "user": "root"}, &r); code != 200 || r.Stdout != "done\n" {
		t.Errorf("as root in the run dir: %d %+v", code, r)
	}
	var e apiError
	// Refused as what it is (a socket, 400) before the read-only mount
	// would refuse it (403).
	if code := s.do("PUT", "/v1/sandboxes/"+id+"/files?path=/.space/run/agent.sock", s.key, "x", &e); code != 400 && code != 403 {
		t.Errorf("upload over the agent socket: %d %+v", code, e)
	}
	if r := s.sh(id, "echo alive"); r.Stdout != "alive\n" {
		t.Errorf("sandbox after the attempts: %+v", r)
	}
}

func TestIsolation(t *testing.T) {
	s := sharedServer(t)
	id := s.create(map[string]any{"memory_mb": 256, "cpu": 1})
	wd, _ := os.Getwd()
	if r := s.sh(id, "ls "+wd+" 2>&1; echo rc=$?"); !strings.Contains(r.Stdout, "rc=2") {
		t.Errorf("host checkout visible inside: %q", r.Stdout)
	}
	// Host processes are invisible: only the sandbox's own.
	r := s.sh(id, "ps -e -o comm=")
	for _, p := range strings.Fields(r.Stdout) {
		switch p {
		case "space-agent", "ps", "bash", "sh":
		default:
			t.Errorf("unexpected process visible inside: %q (all: %q)", p, r.Stdout)
		}
	}
	if r := s.sh(id, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"); strings.TrimSpace(r.Stdout) != "lo" && strings.TrimSpace(r.Stdout) != "" {
		t.Errorf("interfaces: %q", r.Stdout)
	}
	if r := s.sh(id, "uname -r"); strings.TrimSpace(r.Stdout) == hostKernel() {
		t.Errorf("guest sees the host kernel %q", r.Stdout)
	}
	// A template file changed in one sandbox stays in that sandbox.
	var rr execResult
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "echo changed >> /etc/os-release", "user": "root"}, &rr)
	other := s.create(nil)
	if r := s.sh(other, "grep -c changed /etc/os-release"); strings.TrimSpace(r.Stdout) != "0" {
		t.Errorf("template change leaked to another sandbox: %q", r.Stdout)
	}
	// Memory hog: a 1 GiB allocation in a 256 MB sandbox never succeeds;
	// the memory cgroup stops it (gVisor's kernel is one host process, so
	// the OOM kill takes the sandbox with it, recorded as reason "oom"),
	// and nothing else notices.
	hogbox := s.create(map[string]any{"memory_mb": 256})
	var hog execResult
	code := s.do("POST", "/v1/sandboxes/"+hogbox+"/exec", s.key, map[string]any{"cmd": []string{"python3", "-c", "x = bytearray(1024*1024*1024); print(len(x))"}}, &hog)
	if code == 200 && hog.ExitCode == 0 {
		t.Errorf("1 GiB allocation succeeded in a 256 MB sandbox: %+v", hog)
	}
	var hs sandboxView
	s.do("GET", "/v1/sandboxes/"+hogbox, s.key, nil, &hs)
	if hs.State != "running" {
		waitFor(t, "the OOM-killed sandbox to be marked", 20*time.Second, func() bool {
			s.do("GET", "/v1/sandboxes/"+hogbox, s.key, nil, &hs)
			return hs.State == "stopped"
		})
		if !strings.Contains(hs.Reason, "oom") {
			t.Errorf("OOM-killed sandbox reason %q", hs.Reason)
		}
	}
	if r := s.sh(id, "echo unaffected"); r.Stdout != "unaffected\n" {
		t.Errorf("other sandbox after the memory hog: %+v", r)
	}
	// Fork bomb: contained by the pids limit; the server and other
	// sandboxes keep answering while it runs.
	var bomb struct{ PID int }
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "b() { b | b & }; b", "background": true, "timeout_s": 20}, &bomb)
	time.Sleep(2 * time.Second) // let it hit the limit
	start := time.Now()
	if r := s.sh(other, "echo alive"); r.Stdout != "alive\n" {
		t.Errorf("other sandbox during fork bomb: %+v", r)
	}
	var h map[string]string
	if code := s.do("GET", "/healthz", "", nil, &h); code != 200 {
		t.Errorf("healthz during fork bomb: %d", code)
	}
	t.Logf("other sandbox answered in %v during the fork bomb", time.Since(start))
	if code := s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil); code != 204 {
		t.Errorf("kill fork-bombed sandbox: %d", code)
	}
}

func hostKernel() string {
	out, _ := exec.Command("uname", "-r").Output()
	return strings.TrimSpace(string(out))
}

func TestRestartRecovers(t *testing.T) {
	s := startServer(t, "", "--pool-size", "-1")
	keep := s.create(nil)
	gone := s.create(nil)
	var bg struct{ PID int }
	s.do("POST", "/v1/sandboxes/"+keep+"/exec", s.key, map[string]any{"cmd": "sleep 1000", "background": true}, &bg)
	s.put(keep, "/home/user/state.txt", strings.NewReader("before restart"))
	s.kill9()
	// While the server is down, one sandbox dies on its own.
	runscKill(t, s.data, gone)
	s.start()
	var sb sandboxView
	s.do("GET", "/v1/sandboxes/"+keep, s.key, nil, &sb)
	if sb.State != "running" {
		t.Fatalf("after restart: %+v", sb)
	}
	if r := s.sh(keep, "cat /home/user/state.txt"); r.Stdout != "before restart" {
		t.Errorf("file after restart: %+v", r)
	}
	var ps struct {
		Processes []struct {
			PID     int  `json:"pid"`
			Running bool `json:"running"`
		}
	}
	s.do("GET", "/v1/sandboxes/"+keep+"/processes", s.key, nil, &ps)
	alive := false
	for _, p := range ps.Processes {
		alive = alive || (p.PID == bg.PID && p.Running)
	}
	if !alive {
		t.Errorf("background process %d not running after restart: %+v", bg.PID, ps)
	}
	waitFor(t, "the dead sandbox to be marked stopped", 20*time.Second, func() bool {
		s.do("GET", "/v1/sandboxes/"+gone, s.key, nil, &sb)
		return sb.State == "stopped"
	})
	if !strings.Contains(sb.Reason, "lost") {
		t.Errorf("sandbox that died while the server was down: %+v", sb)
	}
	// Kill everything: no runsc process of this data dir may remain.
	s.do("DELETE", "/v1/sandboxes/"+keep, s.key, nil, nil)
	waitFor(t, "runsc processes to exit", 20*time.Second, func() bool { return len(runscProcs(s.data)) == 0 })
}

// runscKill kills a sandbox behind the server's back.
func runscKill(t *testing.T, data, id string) {
	for _, pid := range runscProcs(data) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), id) {
			_ = syscallKill(pid)
		}
	}
	waitFor(t, "sandbox "+id+" to die", 20*time.Second, func() bool {
		for _, pid := range runscProcs(data) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if strings.Contains(string(cmdline), id) {
				return false
			}
		}
		return true
	})
}

// A fork bomb is held to the sandbox's task limit (RLIMIT_NPROC scaled to
// its memory) and the sandbox lives on: before, it stopped for OOM (the
// sentry's memory per task) within seconds. Root in the sandbox still
// works, and killing the bomb's process group ends it.
func TestForkBomb(t *testing.T) {
	s := sharedServer(t)
	id := s.create(map[string]any{"memory_mb": 256})
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	var bg struct{ PID int }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "bomb(){ bomb|bomb & }; bomb; sleep 600", "background": true}, &bg); code != 202 || bg.PID == 0 {
		t.Fatalf("start the bomb: %d %+v", code, bg)
	}
	// The bomb fills the user's task limit (192 in 256 MiB); wait until it
	// holds most of it.
	waitFor(t, "the bomb to reach the task limit", 60*time.Second, func() bool {
		var r execResult
		if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "ps -u user --no-headers | wc -l", "user": "root"}, &r); code != 200 {
			t.Fatalf("root during the bomb: %d %+v", code, r)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(r.Stdout))
		return n >= 150
	})
	var sb sandboxView
	if s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); sb.State != "running" {
		t.Fatalf("sandbox after a fork bomb: %+v", sb)
	}
	var r execResult
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "echo alive", "user": "root"}, &r); code != 200 || r.Stdout != "alive\n" {
		t.Fatalf("root during the bomb: %d %+v", code, r)
	}
	if code := s.do("POST", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", id, bg.PID), s.key, map[string]string{"signal": "SIGKILL"}, nil); code != 204 {
		t.Fatalf("kill the bomb: %d", code)
	}
	// On a loaded host one ps during the bomb took 24 s: the wait is a
	// minute, and a failure says what was left (state, group, parent).
	for deadline := time.Now().Add(time.Minute); ; {
		var r execResult
		s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "ps -u user --no-headers | wc -l", "user": "root"}, &r)
		if strings.TrimSpace(r.Stdout) == "0" {
			break
		}
		if time.Now().After(deadline) {
			var left execResult
			s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "ps -u user -o stat=,pgid=,ppid=,comm= | sort | uniq -c | sort -rn | head -20", "user": "root"}, &left)
			t.Fatalf("the bomb's processes did not end (the group was SIGKILLed; pgid %d); left (count, state, pgid, ppid, command):\n%s", bg.PID, left.Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Root at its task limit (the agent forks as root, so every command
	// counts there first): a command finds no room, a 503 that says why (it
	// was a 500 "internal error"); the agent lives on, and commands run
	// again once the processes are killed.
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "for i in $(seq 400); do sleep 600 & done; wait", "background": true, "user": "root"}, &bg); code != 202 {
		t.Fatalf("fill root's task limit: %d", code)
	}
	waitFor(t, "root's tasks to reach the limit", 60*time.Second, func() bool {
		var out struct {
			apiError
			ExitCode int `json:"exit_code"`
		}
		switch code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"true"}, "user": "root"}, &out); code {
		case 200:
			return false
		case 503:
			if out.Error != "unavailable" || !strings.Contains(out.Message, "processes") {
				t.Fatalf("exec at the task limit: %+v", out)
			}
			return true
		default:
			t.Fatalf("exec at the task limit: %d %+v", code, out)
		}
		return false
	})
	// At the limit the agent may be unable to answer for a moment: a 503
	// says so and is retried, as a client would (a dead agent never
	// answers 204 and fails the wait).
	waitFor(t, "the filler to be killed", 30*time.Second, func() bool {
		var e apiError
		switch code := s.do("POST", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", id, bg.PID), s.key, map[string]string{"signal": "SIGKILL"}, &e); code {
		case 204:
			return true
		case 503:
			t.Logf("kill the filler at the task limit: 503 %s", e.Message)
			return false
		default:
			t.Fatalf("kill the filler: %d %+v", code, e)
		}
		return false
	})
	waitFor(t, "commands to run again", 30*time.Second, func() bool {
		var r execResult
		return s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "echo alive"}, &r) == 200 && r.Stdout == "alive\n"
	})
}

// TestAbandonedStreams: clients that open event streams of a chatty
// process and go away without reading leave nothing behind in the server
// (each held a goroutine, its agent stream and up to 4 MiB of output for
// good: 120 of them grew the heap by 577 MB).
func TestAbandonedStreams(t *testing.T) {
	// A server of its own without a pool: its goroutine count moves only
	// with the streams.
	s := startServer(t, "", "--pool-size", "-1")
	defer s.stop(true)
	id := s.create(nil)
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	var bg struct{ PID int }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "while :; do head -c 200000 /dev/zero | tr '\\0' x; echo; sleep 0.02; done", "background": true}, &bg); code != 202 {
		t.Fatalf("start: %d", code)
	}
	goroutines := func() int {
		resp, err := http.Get(s.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^go_goroutines (\d+)`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("no go_goroutines in /metrics")
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	var r execResult
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "true"}, &r) // the agent session is up
	before := goroutines()
	host := strings.TrimPrefix(s.url, "http://")
	var conns []net.Conn
	for range 20 {
		// A small receive buffer set before connecting (so the window is
		// small): the server's writes block soon.
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
		}}
		c, err := d.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /v1/sandboxes/%s/processes/%d/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", id, bg.PID, host, s.key)
		conns = append(conns, c)
	}
	time.Sleep(3 * time.Second) // the streams fill up: nobody reads
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, "the server to let go of the streams", 30*time.Second, func() bool {
		n := goroutines()
		t.Logf("goroutines: %d before, %d now", before, n)
		return n <= before+5
	})
}

// TestPTYThreads: terminals do not cost the agent an OS thread each (their
// masters were in blocking mode: ~200 terminals used up the task limit and
// the agent died, and the sandbox with it).
func TestPTYThreads(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	threads := func() int {
		var r execResult
		s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "awk '/^Threads/ {print $2}' /proc/1/status", "user": "root"}, &r)
		n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
		if err != nil {
			t.Fatalf("agent threads: %+v", r)
		}
		return n
	}
	before := threads()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for range 30 {
		wsURL := strings.Replace(s.url, "http://", "ws://", 1) + "/v1/sandboxes/" + id + "/pty?cmd=/bin/sh"
		c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + s.key}}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		c.Write(ctx, websocket.MessageBinary, []byte("echo up\n"))
	}
	if after := threads(); after > before+10 {
		t.Errorf("the agent has %d threads with 30 terminals open, %d before", after, before)
	}
}

// TestStreamLimit: a sandbox has at most 128 output streams open at once
// (each holds an agent stream and up to 4 MiB of output in the server:
// 1,000 slow readers took the server past 4 GB); the next is a 503 until
// one closes.
func TestStreamLimit(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	var bg struct{ PID int }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "sleep 600", "background": true}, &bg); code != 202 {
		t.Fatalf("start: %d", code)
	}
	host := strings.TrimPrefix(s.url, "http://")
	open := func() (net.Conn, *http.Response) {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /v1/sandboxes/%s/processes/%d/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", id, bg.PID, host, s.key)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		return c, resp
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 128 {
		c, resp := open()
		conns = append(conns, c)
		if resp.StatusCode != 200 {
			t.Fatalf("stream %d: %d", i, resp.StatusCode)
		}
	}
	c, resp := open()
	var e apiError
	json.NewDecoder(resp.Body).Decode(&e)
	c.Close()
	if resp.StatusCode != 503 || e.Error != "unavailable" || !strings.Contains(e.Message, "streams") {
		t.Fatalf("stream 129: %d %+v", resp.StatusCode, e)
	}
	// A terminal refused for want of a stream leaves no shell behind (it
	// was started first and waited on its stdin for good).
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://"+host+"/v1/sandboxes/"+id+"/pty", &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + s.key}}})
	if err == nil {
		if _, _, err := ws.Read(ctx); websocket.CloseStatus(err) != websocket.StatusInternalError {
			t.Errorf("a terminal past the streams: %v, want it closed with an error", err)
		}
		ws.CloseNow()
	}
	waitFor(t, "the refused terminal's shell to end", 30*time.Second, func() bool {
		running := 0
		for _, p := range s.processes(id) {
			if p.Running {
				running++
			}
		}
		return running == 1 // sleep 600
	})
	conns[0].Close()
	conns = conns[1:]
	waitFor(t, "a stream to be let go", 10*time.Second, func() bool {
		c, resp := open()
		if resp.StatusCode == 200 {
			conns = append(conns, c)
			return true
		}
		c.Close()
		return false
	})
}

// TestAutoResume: a sandbox created with auto_resume, paused by its timeout
// or by a caller, is resumed by the next request into it (a command, a
// file, its port; several at once) with a new timeout period; pause,
// snapshot and other operations still see it paused; without auto_resume
// a command gets 409 as before.
func TestAutoResume(t *testing.T) {
	s := sharedServer(t)
	var sb struct {
		sandboxView
		AutoResume bool `json:"auto_resume"`
	}
	if code := s.do("POST", "/v1/sandboxes", s.key, map[string]any{"timeout_s": 3, "on_timeout": "pause", "auto_resume": true}, &sb); code != 201 || !sb.AutoResume {
		t.Fatalf("create with auto_resume: %d %+v", code, sb)
	}
	id := sb.ID
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	startPortServer(t, s, s.key, id, 8000)
	if code := s.do("PUT", "/v1/sandboxes/"+id+"/files?path=/tmp/state", s.key, "kept", nil); code != 200 {
		t.Fatalf("write: %d", code)
	}
	paused := func(what string) {
		t.Helper()
		waitFor(t, what, time.Minute, func() bool {
			s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb)
			return sb.State == "paused"
		})
	}
	paused("the timeout to pause it")
	var e apiError
	if code := s.do("POST", "/v1/sandboxes/"+id+"/pause", s.key, nil, &e); code != 409 {
		t.Errorf("pause of a paused auto_resume sandbox: %d, want 409 (only requests into it wake it)", code)
	}
	// Five commands at once: one resumes it, all run.
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			var r execResult
			if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "cat /tmp/state"}, &r); code != 200 || r.Stdout != "kept" {
				t.Errorf("command %d on a paused auto_resume sandbox: %d %+v", i, code, r)
			}
		})
	}
	wg.Wait()
	s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb)
	if sb.State != "running" || !sb.ExpiresAt.After(time.Now()) {
		t.Errorf("after the commands: %+v", sb)
	}
	// Paused by a caller this time; its port wakes it.
	if code := s.do("POST", "/v1/sandboxes/"+id+"/pause", s.key, nil, nil); code != 200 {
		t.Fatalf("pause: %d", code)
	}
	if code, body := httpGet(t, s.url+"/v1/sandboxes/"+id+"/ports/8000/woken", "", http.Header{"Authorization": {"Bearer " + s.key}}); code != 200 || body != "path=/woken" {
		t.Errorf("the port of a paused auto_resume sandbox: %d %q", code, body)
	}
	// And a file read.
	s.do("POST", "/v1/sandboxes/"+id+"/pause", s.key, nil, nil)
	if code := s.do("GET", "/v1/sandboxes/"+id+"/files/stat?path=/tmp/state", s.key, nil, nil); code != 200 {
		t.Errorf("a file stat on a paused auto_resume sandbox: %d", code)
	}

	// Without auto_resume nothing wakes it.
	plain := s.create(nil)
	defer s.do("DELETE", "/v1/sandboxes/"+plain, s.key, nil, nil)
	s.do("POST", "/v1/sandboxes/"+plain+"/pause", s.key, nil, nil)
	if code := s.do("POST", "/v1/sandboxes/"+plain+"/exec", s.key, map[string]any{"cmd": "true"}, &e); code != 409 || e.State != "paused" {
		t.Errorf("a command on a paused sandbox without auto_resume: %d %+v", code, e)
	}
}
