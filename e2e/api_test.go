package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	space "github.com/spacesandbox/space/sdk/go"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/store/pgtest"
)

// One server for the API tests: creating servers is cheap, but sharing one
// keeps the suite fast on 2 cores. Tests that restart or kill the server
// make their own. It runs every driver the host has; tests run per driver
// (forEachDriver, drivers_test.go).
var shared *server

func sharedServer(t *testing.T) *server {
	if shared == nil {
		shared = startServer(&keepAlive{t}, "", sharedServerDrivers()...)
	}
	shared.t = t
	// A failed test gets what the shared server logged while it ran: the
	// tail printed at the end of the run is mostly later tests'.
	from := len(shared.logText())
	t.Cleanup(func() {
		if t.Failed() {
			text := shared.logText()
			t.Logf("shared server log during %s:\n%s", t.Name(), tail(text[min(from, len(text)):], 12000))
		}
	})
	return shared
}

// keepAlive lets the shared server outlive the first test that started it;
// TestMain stops it.
type keepAlive struct{ *testing.T }

func (k *keepAlive) Cleanup(func()) {}

func (k *keepAlive) TempDir() string {
	d, err := os.MkdirTemp("", "space-e2e-")
	if err != nil {
		k.Fatal(err)
	}
	return d
}

func TestMain(m *testing.M) {
	code := pgtest.Main(m) // m.Run, then the Postgres test cluster (if one started) stops
	if shared != nil {
		if code != 0 {
			// The shared server outlives the test that failed: its log is
			// the only record of what the sandboxes saw.
			os.WriteFile("/tmp/space-e2e-shared-server.log", []byte(shared.logText()), 0o644)
			fmt.Printf("shared server log (full: /tmp/space-e2e-shared-server.log):\n%s\n", tail(shared.logText(), 12000))
		}
		shared.t = &quietT{}
		shared.stop(true)
		os.RemoveAll(shared.data)
	}
	if binPath != "" { // the binary spaceBin built (27 MB a run, left in /tmp before)
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// TestMetricsListen: with --metrics-listen, /metrics answers on its own
// address and no longer on the API listener (which tenants may reach).
func TestMetricsListen(t *testing.T) {
	addr := freeAddr(t)
	s := startServer(t, "", "--metrics-listen", addr, "--pool-size", "-1", "--snapshot-interval", "-1")
	if code, body := httpGet(t, "http://"+addr+"/metrics", "", nil); code != 200 || !strings.Contains(body, "space_sandboxes{") {
		t.Errorf("/metrics on --metrics-listen: %d %.200q", code, body)
	}
	if code, _ := httpGet(t, s.url+"/metrics", "", nil); code != 404 {
		t.Errorf("/metrics on the API listener with --metrics-listen set: %d", code)
	}
	if code, _ := httpGet(t, "http://"+addr+"/v1/sandboxes", "", nil); code != 404 {
		t.Errorf("the API on the metrics address: %d", code)
	}
}

func TestHealthMetricsOpenAPI(t *testing.T) {
	s := sharedServer(t)
	var h map[string]string
	if code := s.do("GET", "/healthz", "", nil, &h); code != 200 || h["status"] != "ok" {
		t.Fatalf("healthz: %d %v", code, h)
	}
	s.sh(s.create(nil), "true")
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`space_sandboxes{state="running"}`, "space_sandbox_create_seconds_bucket", "space_exec_start_seconds"} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	resp, err = http.Get(s.url + "/v1/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(spec, []byte("openapi:")) || !bytes.Contains(spec, []byte("/v1/sandboxes/{id}/exec")) {
		t.Errorf("openapi.yaml: %d, %d bytes", resp.StatusCode, len(spec))
	}
}

func TestCreateGetListKill(t *testing.T) { forEachDriver(t, testCreateGetListKill) }

func testCreateGetListKill(t *testing.T, drv string) {
	s := sharedServer(t)
	run := "list-" + drv
	id := s.createOn(t, drv, map[string]any{"metadata": map[string]string{"owner": "e2e", "run": run}, "timeout_s": 600})
	var sb sandboxView
	if code := s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); code != 200 || sb.State != "running" || sb.Template != "base" || sb.Driver != drv {
		t.Fatalf("get: %d %+v", code, sb)
	}
	if d := sb.ExpiresAt.Sub(sb.CreatedAt); d < 599*time.Second || d > 601*time.Second {
		t.Errorf("expires_at - created_at = %v, want 600s", d)
	}
	// Every sandbox runs its own kernel, never the host's.
	if r := s.sh(id, "uname -r"); r.ExitCode != 0 || strings.TrimSpace(r.Stdout) == hostKernel() {
		t.Errorf("guest kernel %q, host %q", r.Stdout, hostKernel())
	}
	var list struct{ Sandboxes []sandboxView }
	s.do("GET", "/v1/sandboxes?metadata=run%3D"+run+"&state=running", s.key, nil, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != id {
		t.Fatalf("list by metadata: %+v", list)
	}
	if code := s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb)
	if sb.State != "stopped" {
		t.Fatalf("after delete: %+v", sb)
	}
	var e apiError
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": "true"}, &e); code != 409 || e.Error != "conflict" || e.State != "stopped" {
		t.Errorf("exec on stopped: %d %+v", code, e)
	}
	if code := s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil); code != 204 {
		t.Errorf("second delete: %d", code)
	}
	s.do("GET", "/v1/sandboxes", s.key, nil, &list)
	for _, x := range list.Sandboxes {
		if x.ID == id {
			t.Errorf("stopped sandbox in default list")
		}
	}
}

func TestExecSSE(t *testing.T) { forEachDriver(t, testExecSSE) }

func testExecSSE(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.sharedSandbox(t, drv)
	resp := s.stream("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
		"cmd": []string{"python3", "-c", "import sys; print(sum(range(10))); sys.stdout.flush(); print('bad', file=sys.stderr); sys.exit(4)"},
	}, nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var kinds []string
	var stdout, stderr string
	var lastID int
	exit := -1
	readSSE(t, resp.Body, func(e sseEvent) bool {
		kinds = append(kinds, e.Event)
		n, err := strconv.Atoi(e.ID)
		if err != nil || n <= lastID {
			t.Errorf("event %s: id %q not increasing after %d", e.Event, e.ID, lastID)
		}
		lastID = n
		var d struct {
			PID      int    `json:"pid"`
			Data     string `json:"data"`
			ExitCode *int   `json:"exit_code"`
		}
		if err := json.Unmarshal([]byte(e.Data), &d); err != nil {
			t.Errorf("event data %q: %v", e.Data, err)
		}
		switch e.Event {
		case "start":
			if d.PID <= 0 {
				t.Errorf("start without pid: %s", e.Data)
			}
		case "stdout":
			stdout += d.Data
		case "stderr":
			stderr += d.Data
		case "exit":
			exit = *d.ExitCode
		}
		return true
	})
	if kinds[0] != "start" || kinds[len(kinds)-1] != "exit" {
		t.Errorf("event order %v: want start first, exit last", kinds)
	}
	if stdout != "45\n" || stderr != "bad\n" || exit != 4 {
		t.Errorf("stdout %q stderr %q exit %d", stdout, stderr, exit)
	}
}

func TestExecJSONAndShell(t *testing.T) { forEachDriver(t, testExecJSONAndShell) }

func testExecJSONAndShell(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.sharedSandbox(t, drv)
	r := s.sh(id, "echo $GREETING $EXTRA from $(whoami) in $(pwd); exit 7")
	if r.Stdout != "hi from user in /home/user\n" || r.ExitCode != 7 {
		t.Errorf("shell: %+v", r)
	}
	var r2 execResult
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{
		"cmd": []string{"sh", "-c", "echo $EXTRA; pwd; id -u"}, "env": map[string]string{"EXTRA": "x"}, "cwd": "/tmp", "user": "root",
	}, &r2)
	if r2.Stdout != "x\n/tmp\n0\n" || r2.ExitCode != 0 {
		t.Errorf("argv with env/cwd/user: %+v", r2)
	}
	// A shell command is a login shell; the base template's /etc/profile
	// still sets Debian's PATH for the user and for root, but without
	// running id(1) (a process start costs tens of ms in a sandbox).
	s.sh(id, `mkdir -p /tmp/fakeid && printf '#!/bin/sh\ntouch /tmp/fakeid/ran\nexec /usr/bin/id "$@"\n' > /tmp/fakeid/id && chmod 755 /tmp/fakeid/id`)
	for user, path := range map[string]string{
		"user": "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games",
		"root": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	} {
		var r execResult
		s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{
			"cmd": "echo $PATH; test -e /tmp/fakeid/ran && echo ran id", "user": user, "env": map[string]string{"PATH": "/tmp/fakeid:/usr/bin:/bin"},
		}, &r)
		if r.Stdout != path+"\n" || r.ExitCode != 1 {
			t.Errorf("login shell as %s: %+v", user, r)
		}
	}
	var r3 execResult
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"cat"}, "stdin": "from stdin"}, &r3)
	if r3.Stdout != "from stdin" {
		t.Errorf("stdin: %+v", r3)
	}
	var r4 execResult
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"sleep", "30"}, "timeout_s": 1}, &r4)
	if r4.ExitCode == 0 || r4.Error != "timeout" {
		t.Errorf("timeout: %+v", r4)
	}
	// A program that does not exist is a clear client error, not a
	// process that ran.
	var e5 apiError
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"no-such-program"}}, &e5); code != 404 || !strings.Contains(e5.Message, "no-such-program") {
		t.Errorf("missing program: %d %+v", code, e5)
	}
	// ls -l needs a working statx (broken in Debian's old runsc).
	if r := s.sh(id, "ls -l / >/dev/null && echo ok"); r.Stdout != "ok\n" {
		t.Errorf("ls -l: %+v", r)
	}
}

// A process holds its three standard descriptors and nothing else of the
// agent's: no pipe of another process, not the /dev/null the agent keeps
// open for every stdin, no connection to the host.
func TestProcessDescriptors(t *testing.T) { forEachDriver(t, testProcessDescriptors) }

func testProcessDescriptors(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.sharedSandbox(t, drv)
	var other, bg, in struct{ PID int }
	for _, p := range []struct {
		req map[string]any
		out *struct{ PID int }
	}{
		{map[string]any{"cmd": []string{"cat"}, "background": true, "open_stdin": true}, &other},
		{map[string]any{"cmd": []string{"sleep", "60"}, "background": true}, &bg},
		{map[string]any{"cmd": []string{"sleep", "60"}, "background": true, "open_stdin": true}, &in},
	} {
		if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, p.req, p.out); code != 202 || p.out.PID <= 0 {
			t.Fatalf("background exec %v: %d", p.req["cmd"], code)
		}
		defer s.do("POST", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", id, p.out.PID), s.key, map[string]string{"signal": "SIGKILL"}, nil)
	}
	fds := func(pid int) []string {
		r := s.sh(id, fmt.Sprintf(`cd /proc/%d/fd && for f in *; do echo "$f $(readlink $f)"; done`, pid))
		if r.ExitCode != 0 {
			t.Fatalf("list descriptors of %d: %+v", pid, r)
		}
		return strings.Split(strings.TrimSpace(r.Stdout), "\n")
	}
	pipe := regexp.MustCompile(`^pipe:\[\d+\]$`)
	for _, c := range []struct {
		pid   int
		stdin string
	}{{bg.PID, "/dev/null"}, {in.PID, "pipe"}} {
		got := fds(c.pid)
		if len(got) != 3 {
			t.Errorf("process %d holds %d descriptors, want 3: %q", c.pid, len(got), got)
			continue
		}
		var targets []string
		for i, line := range got {
			n, target, _ := strings.Cut(line, " ")
			if n != strconv.Itoa(i) {
				t.Errorf("process %d: descriptor %q, want %d", c.pid, line, i)
			}
			targets = append(targets, target)
		}
		if c.stdin == "/dev/null" && targets[0] != "/dev/null" || c.stdin == "pipe" && !pipe.MatchString(targets[0]) {
			t.Errorf("process %d: stdin is %q, want %s", c.pid, targets[0], c.stdin)
		}
		if !pipe.MatchString(targets[1]) || !pipe.MatchString(targets[2]) || targets[1] == targets[2] || targets[1] == targets[0] {
			t.Errorf("process %d: stdout %q, stderr %q: want two pipes of its own", c.pid, targets[1], targets[2])
		}
	}
}

func TestExecLargeAndBinaryOutput(t *testing.T) { forEachDriver(t, testExecLargeAndBinaryOutput) }

func testExecLargeAndBinaryOutput(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.sharedSandbox(t, drv)
	// 12 MB of deterministic text streamed over SSE, checked byte for byte.
	const n = 12 << 20
	script := fmt.Sprintf("import sys\nb=bytes((i*7+3)%%26+97 for i in range(65536))\nfor _ in range(%d): sys.stdout.buffer.write(b)\n", n/65536)
	resp := s.stream("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"python3", "-c", script}}, nil)
	h := sha256.New()
	total := 0
	readSSE(t, resp.Body, func(e sseEvent) bool {
		if e.Event == "stdout" {
			var d struct{ Data string }
			json.Unmarshal([]byte(e.Data), &d)
			h.Write([]byte(d.Data))
			total += len(d.Data)
		}
		return true
	})
	want := sha256.New()
	block := make([]byte, 65536)
	for i := range block {
		block[i] = byte((i*7+3)%26 + 97)
	}
	for i := 0; i < n/65536; i++ {
		want.Write(block)
	}
	if total != n || !bytes.Equal(h.Sum(nil), want.Sum(nil)) {
		t.Fatalf("large output: got %d bytes (want %d), digest match %v", total, n, bytes.Equal(h.Sum(nil), want.Sum(nil)))
	}
	// Binary output comes back base64-encoded, intact.
	var r execResult
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"printf", `\377\376\000\001`}}, &r)
	got, _ := base64.StdEncoding.DecodeString(r.StdoutB64)
	if !bytes.Equal(got, []byte{0xff, 0xfe, 0, 1}) {
		t.Errorf("binary output: %+v", r)
	}
	// So is valid UTF-8 that is mostly control bytes (as in SSE events):
	// JSON would escape each as six bytes.
	var rz execResult
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"printf", `a\000\000\000\001`}}, &rz)
	if got, _ := base64.StdEncoding.DecodeString(rz.StdoutB64); rz.Stdout != "" || !bytes.Equal(got, []byte("a\x00\x00\x00\x01")) {
		t.Errorf("control-heavy output: %+v", rz)
	}
	resp = s.stream("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"printf", `\377\376`}}, nil)
	sawB64 := false
	readSSE(t, resp.Body, func(e sseEvent) bool {
		if e.Event == "stdout" {
			var d struct {
				DataB64 string `json:"data_b64"`
			}
			json.Unmarshal([]byte(e.Data), &d)
			b, _ := base64.StdEncoding.DecodeString(d.DataB64)
			sawB64 = bytes.Equal(b, []byte{0xff, 0xfe})
		}
		return true
	})
	if !sawB64 {
		t.Errorf("SSE binary chunk not sent as data_b64")
	}
	// Valid UTF-8 that is mostly control bytes (zeros) goes as base64
	// too, not as six-byte JSON escapes; text with newlines stays text.
	resp = s.stream("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": "head -c 4096 /dev/zero; printf 'a\\nb\\n' >&2"}, nil)
	var zeros []byte
	var text string
	readSSE(t, resp.Body, func(e sseEvent) bool {
		var d struct {
			Data    string `json:"data"`
			DataB64 string `json:"data_b64"`
		}
		json.Unmarshal([]byte(e.Data), &d)
		switch e.Event {
		case "stdout":
			if d.Data != "" {
				t.Errorf("zeros sent as text: %d bytes", len(d.Data))
			}
			b, _ := base64.StdEncoding.DecodeString(d.DataB64)
			zeros = append(zeros, b...)
		case "stderr":
			text += d.Data
		}
		return true
	})
	if !bytes.Equal(zeros, make([]byte, 4096)) || text != "a\nb\n" {
		t.Errorf("zeros: %d bytes intact=%v; text %q", len(zeros), bytes.Equal(zeros, make([]byte, 4096)), text)
	}
}

// A sandbox that runs many commands with large output keeps running: the
// agent retains the output of exited processes within one budget, not
// 8 MiB for each of the last 256 (which filled a small sandbox's memory
// and the sandbox was stopped for OOM after a dozen such commands).
func TestManyLargeOutputs(t *testing.T) {
	s := sharedServer(t)
	id := s.createOn(t, "gvisor", map[string]any{"memory_mb": 128})
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	for i := range 30 {
		var bg struct{ PID int }
		if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{
			"cmd": []string{"head", "-c", "8388608", "/dev/zero"}, "background": true,
		}, &bg); code != 202 {
			t.Fatalf("command %d: %d", i, code)
		}
		waitFor(t, fmt.Sprintf("command %d to exit", i), 60*time.Second, func() bool {
			for _, p := range s.processes(id) {
				if p.PID == bg.PID && p.Running {
					return false
				}
			}
			return true
		})
	}
	s.mustLive(id, "after 30 commands with 8 MiB of output each")
}

// Sixteen background processes that each print 8 MiB and keep running must
// not exhaust a 128 MiB sandbox: running processes share the agent's
// output budget (a dozen of them stopped such a sandbox for OOM before).
func TestManyRunningOutputs(t *testing.T) {
	s := sharedServer(t)
	id := s.createOn(t, "gvisor", map[string]any{"memory_mb": 128})
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	const n = 16
	for i := range n {
		if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{
			"cmd": fmt.Sprintf("head -c 8388608 /dev/zero; touch /tmp/printed%d; exec sleep 600", i), "background": true,
		}, nil); code != 202 {
			t.Fatalf("command %d: %d", i, code)
		}
	}
	waitFor(t, "every command to print its output", 120*time.Second, func() bool {
		var sb sandboxView
		if code := s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); code != 200 || sb.State != "running" {
			t.Fatalf("while %d commands print 8 MiB each: %d %+v", n, code, sb)
		}
		return s.sh(id, "ls /tmp | grep -c printed").Stdout == fmt.Sprintf("%d\n", n)
	})
	running := 0
	for _, p := range s.processes(id) {
		if p.Running {
			running++
		}
	}
	if running < n {
		t.Fatalf("%d of %d background processes running", running, n)
	}
	s.mustLive(id, fmt.Sprintf("with %d background processes that printed 8 MiB each", n))
}

// A process that allocates past its sandbox's memory is killed, as a VM's
// kernel would kill it, and the sandbox lives on. Under gVisor the host's
// OOM killer used to take the whole sandbox (state stopped, reason oom)
// when the allocation was fast: now the host's limit sits above the
// sandbox's memory and the agent kills the largest process when the
// host sees the sandbox reach it.
func TestOOMKillsProcessNotSandbox(t *testing.T) {
	s := sharedServer(t)
	id := s.createOn(t, "gvisor", map[string]any{"memory_mb": 256})
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	if r := s.sh(id, "grep MemTotal /proc/meminfo"); !strings.Contains(r.Stdout, " 262144 kB") {
		t.Fatalf("the sandbox should see its own memory, not the host's headroom: %q", r.Stdout)
	}
	// Back to back: each allocation starts a few ms after the previous
	// one's kill, while gVisor still holds the killed process's memory
	// (the memory watch follows that release; see memGuard).
	for _, alloc := range []string{
		"b'x' * (600 << 20)",                         // one fast allocation, past the host's limit too
		"x = [b'y' * (64 << 20) for i in range(10)]", // in steps
		"b'x' * (1 << 30)",                           // far past the host's limit too
	} {
		var r execResult
		if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"python3", "-c", alloc}}, &r); code != 200 {
			t.Fatalf("%s: exec %d", alloc, code)
		}
		if r.ExitCode != 137 || r.Error != "oom" {
			t.Fatalf("%s: %+v, want killed with error oom", alloc, r)
		}
		var sb sandboxView
		if code := s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); code != 200 || sb.State != "running" {
			t.Fatalf("after %s: %d %+v", alloc, code, sb)
		}
	}
	// What stays within the memory is left alone, and so is writing a file
	// larger than the memory to disk (page cache, which the host reclaims).
	if r := s.sh(id, "python3 -c \"x = b'x' * (100 << 20); print(len(x))\""); r.ExitCode != 0 || r.Stdout != "104857600\n" {
		t.Fatalf("an allocation within the memory: %+v", r)
	}
	if r := s.sh(id, "head -c 400M /dev/zero > /home/user/big && stat -c %s /home/user/big && rm /home/user/big"); r.ExitCode != 0 || r.Stdout != "419430400\n" {
		t.Fatalf("writing 400 MiB to disk in a 256 MiB sandbox: %+v", r)
	}
	// /tmp is a tmpfs (memory) bounded at half the memory: filling it is
	// ENOSPC, and the sandbox lives on (it used to be unbounded).
	if r := s.sh(id, "grep ' /tmp ' /proc/mounts"); !strings.Contains(r.Stdout, "size=131072k") {
		t.Fatalf("/tmp mount: %q", r.Stdout)
	}
	if r := s.sh(id, "head -c 400M /dev/zero > /tmp/big; echo $?; rm -f /tmp/big"); r.Stdout != "1\n" || !strings.Contains(r.Stderr, "No space left on device") {
		t.Fatalf("filling /tmp: %+v", r)
	}
	var sb sandboxView
	if code := s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); code != 200 || sb.State != "running" {
		t.Fatalf("after filling /tmp: %d %+v", code, sb)
	}
}

func TestBackgroundReattachStdinSignal(t *testing.T) {
	forEachDriver(t, testBackgroundReattachStdinSignal)
}

func testBackgroundReattachStdinSignal(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.sharedSandbox(t, drv)
	var bg struct{ PID int }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{
		"cmd": "for i in 1 2 3 4 5; do echo line$i; sleep 0.1; done", "background": true,
	}, &bg); code != 202 || bg.PID <= 0 {
		t.Fatalf("background exec: %d %+v", code, bg)
	}
	// Listed while running.
	var ps struct {
		Processes []struct {
			PID     int  `json:"pid"`
			Running bool `json:"running"`
		}
	}
	s.do("GET", "/v1/sandboxes/"+id+"/processes", s.key, nil, &ps)
	found := false
	for _, p := range ps.Processes {
		found = found || p.PID == bg.PID
	}
	if !found {
		t.Errorf("background process %d not listed: %+v", bg.PID, ps)
	}
	// Re-attach from the start, collect all ids.
	eventsOf := func(pid int, hdr map[string]string) []sseEvent {
		var out []sseEvent
		resp := s.stream("GET", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/events", id, pid), nil, hdr)
		readSSE(t, resp.Body, func(e sseEvent) bool { out = append(out, e); return true })
		return out
	}
	all := eventsOf(bg.PID, nil)
	if len(all) < 7 || all[0].Event != "start" || all[len(all)-1].Event != "exit" {
		t.Fatalf("full replay: %+v", all)
	}
	// Replay after the third event: exactly the rest.
	rest := eventsOf(bg.PID, map[string]string{"Last-Event-ID": all[2].ID})
	if len(rest) != len(all)-3 || rest[0].ID != all[3].ID {
		t.Fatalf("replay from Last-Event-ID %s: got %d events starting %+v; want %d from id %s", all[2].ID, len(rest), rest[0], len(all)-3, all[3].ID)
	}

	// stdin: a background cat with stdin kept open.
	var cat struct{ PID int }
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"cat"}, "background": true, "open_stdin": true}, &cat)
	req, _ := http.NewRequest("POST", fmt.Sprintf("%s/v1/sandboxes/%s/processes/%d/stdin?eof=true", s.url, id, cat.PID), strings.NewReader("typed input"))
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("stdin: %v %v", err, resp)
	}
	resp.Body.Close()
	out := ""
	for _, e := range eventsOf(cat.PID, nil) {
		if e.Event == "stdout" {
			var d struct{ Data string }
			json.Unmarshal([]byte(e.Data), &d)
			out += d.Data
		}
	}
	if out != "typed input" {
		t.Errorf("cat echoed %q", out)
	}

	// signal
	var sl struct{ PID int }
	s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": []string{"sleep", "300"}, "background": true}, &sl)
	if code := s.do("POST", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", id, sl.PID), s.key, map[string]string{"signal": "SIGTERM"}, nil); code != 204 {
		t.Fatalf("signal: %d", code)
	}
	resp2 := s.stream("GET", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/events", id, sl.PID), nil, nil)
	var exitData string
	readSSE(t, resp2.Body, func(e sseEvent) bool {
		if e.Event == "exit" {
			exitData = e.Data
		}
		return true
	})
	if !strings.Contains(exitData, "SIGTERM") {
		t.Errorf("exit after SIGTERM: %s", exitData)
	}
	var e apiError
	if code := s.do("GET", fmt.Sprintf("/v1/sandboxes/%s/processes/99999/events", id), s.key, nil, &e); code != 404 {
		t.Errorf("events of unknown pid: %d %+v", code, e)
	}
}

// detReader yields n deterministic pseudo-random bytes.
func detReader(seed int64, n int64) io.Reader {
	return io.LimitReader(rand.New(rand.NewSource(seed)), n)
}

func digest(r io.Reader) ([]byte, int64) {
	h := sha256.New()
	n, _ := io.Copy(h, r)
	return h.Sum(nil), n
}

func (s *server) put(id, path string, body io.Reader) int {
	req, _ := http.NewRequest("PUT", s.url+"/v1/sandboxes/"+id+"/files?path="+urlEscape(path), body)
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func (s *server) get(id, path string) (*http.Response, error) {
	req, _ := http.NewRequest("GET", s.url+"/v1/sandboxes/"+id+"/files?path="+urlEscape(path), nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	return http.DefaultClient.Do(req)
}

// TestUploadChecksum: an upload reports the SHA-256 of what it wrote; with
// ?sha256= it writes nothing unless the body has that SHA-256 (a file
// already at the path keeps its bytes); the Go SDK and `space cp` send it.
func TestUploadChecksum(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	const size = 110 << 20
	sum, _ := digest(detReader(7, size))
	want := hex.EncodeToString(sum)
	upload := func(path, sha string, body io.Reader) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("PUT", s.url+"/v1/sandboxes/"+id+"/files?path="+urlEscape(path)+"&sha256="+sha, body)
		req.Header.Set("Authorization", "Bearer "+s.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	if code, out := upload("/home/user/big.bin", want, detReader(7, size)); code != 200 || out["sha256"] != want || out["size"] != float64(size) {
		t.Fatalf("110 MiB with its SHA-256: %d %v", code, out)
	}
	if r := s.sh(id, "sha256sum /home/user/big.bin"); !strings.HasPrefix(r.Stdout, want+" ") {
		t.Errorf("in the sandbox: %q, want %s", r.Stdout, want)
	}
	// A mismatch writes nothing: not over an existing file, not a new one.
	if code := s.put(id, "/home/user/keep.txt", strings.NewReader("original")); code != 200 {
		t.Fatalf("put: %d", code)
	}
	for _, path := range []string{"/home/user/keep.txt", "/home/user/new.txt"} {
		code, out := upload(path, want, strings.NewReader("changed"))
		if code != 400 || out["error"] != "invalid_argument" || !strings.Contains(fmt.Sprint(out["message"]), "SHA-256") {
			t.Errorf("%s with another body's SHA-256: %d %v", path, code, out)
		}
	}
	if r := s.sh(id, "cat /home/user/keep.txt; test -e /home/user/new.txt && echo NEW"); r.Stdout != "original" {
		t.Errorf("after the refused writes: %q", r.Stdout)
	}
	if code, out := upload("/home/user/x.txt", "abc", strings.NewReader("x")); code != 400 || !strings.Contains(fmt.Sprint(out["message"]), "sha256") {
		t.Errorf("a malformed sha256: %d %v", code, out)
	}
	// Without ?sha256= the answer still carries it.
	if code, out := upload("/home/user/plain.txt", "", strings.NewReader("plain")); code != 200 || out["sha256"] != hex.EncodeToString(sha256Of("plain")) {
		t.Errorf("an upload without sha256: %d %v", code, out)
	}

	// The Go SDK: a matching SHA-256, then a wrong one.
	c := space.NewClient(s.url, s.key)
	if fi, err := c.WriteFileChecked(t.Context(), id, "/home/user/sdk.txt", "", hex.EncodeToString(sha256Of("sdk")), strings.NewReader("sdk")); err != nil || fi.SHA256 != hex.EncodeToString(sha256Of("sdk")) {
		t.Errorf("SDK WriteFileChecked: %+v %v", fi, err)
	}
	if _, err := c.WriteFileChecked(t.Context(), id, "/home/user/sdk.txt", "", want, strings.NewReader("other")); !space.IsInvalidArgument(err) {
		t.Errorf("SDK WriteFileChecked with a wrong SHA-256: %v", err)
	}

	// space cp hashes a local file and the server checks it.
	local := filepath.Join(t.TempDir(), "cp.bin")
	os.WriteFile(local, []byte("copied by space cp"), 0o644)
	cp := exec.Command(spaceBin(t), "cp", local, id+":/home/user/cp.bin")
	cp.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+s.key)
	if out, err := cp.CombinedOutput(); err != nil {
		t.Fatalf("space cp: %v %s", err, out)
	}
	if r := s.sh(id, "cat /home/user/cp.bin"); r.Stdout != "copied by space cp" {
		t.Errorf("after space cp: %q", r.Stdout)
	}
}

func sha256Of(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

func TestFiles(t *testing.T) { forEachDriver(t, testFiles) }

func testFiles(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.sharedSandbox(t, drv)
	cases := []struct {
		path string
		size int64
	}{
		{"/home/user/one.bin", 1},
		{"/home/user/a/b/c/nested.txt", 1000},
		{"/home/user/données/日本語 файл.txt", 4096},
		{"relative/100mb.bin", 100 << 20},
	}
	for i, c := range cases {
		if code := s.put(id, c.path, detReader(int64(i), c.size)); code != 200 {
			t.Fatalf("PUT %s: %d", c.path, code)
		}
		resp, err := s.get(id, c.path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %v %v", c.path, err, resp)
		}
		got, n := digest(resp.Body)
		resp.Body.Close()
		want, _ := digest(detReader(int64(i), c.size))
		if n != c.size || !bytes.Equal(got, want) {
			t.Errorf("%s: round trip %d bytes (want %d), digest equal %v", c.path, n, c.size, bytes.Equal(got, want))
		}
	}
	// The sandbox sees the same bytes.
	if r := s.sh(id, "stat -c %s /home/user/relative/100mb.bin; stat -c %U /home/user/one.bin"); r.Stdout != fmt.Sprintf("%d\nuser\n", 100<<20) {
		t.Errorf("inside: %+v", r)
	}
	// ?user= owns the file and the directories made for it; an unknown or
	// malformed user writes nothing.
	if code := s.do("PUT", "/v1/sandboxes/"+id+"/files?path=/home/user/rootdir/sub/r.txt&user=root", s.key, []byte("r"), nil); code != 200 {
		t.Errorf("PUT as root: %d", code)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/files/mkdir", s.key, map[string]string{"path": "/home/user/rootmk/x", "user": "root"}, nil); code != 200 {
		t.Errorf("mkdir as root: %d", code)
	}
	if r := s.sh(id, "stat -c %U /home/user/rootdir/sub/r.txt /home/user/rootdir/sub /home/user/rootmk/x"); r.Stdout != "root\nroot\nroot\n" {
		t.Errorf("owners of what was written as root: %+v", r)
	}
	for _, u := range []string{"nosuchuser", "../x"} {
		var ue apiError
		if code := s.do("PUT", "/v1/sandboxes/"+id+"/files?path=/home/user/bad-user.txt&user="+u, s.key, []byte("x"), &ue); code/100 != 4 {
			t.Errorf("PUT as %q: %d %+v", u, code, ue)
		}
	}
	if r := s.sh(id, "test -e /home/user/bad-user.txt && echo exists"); r.Stdout != "" {
		t.Errorf("a write as an unknown user left a file")
	}
	var list struct {
		Entries []struct {
			Name string `json:"name"`
			Path string `json:"path"`
			Type string `json:"type"`
		}
	}
	if code := s.do("GET", "/v1/sandboxes/"+id+"/files/list?path=/home/user/a&depth=3", s.key, nil, &list); code != 200 {
		t.Fatalf("list: %d", code)
	}
	paths := []string{}
	for _, e := range list.Entries {
		paths = append(paths, e.Path+":"+e.Type)
	}
	joined := strings.Join(paths, ",")
	for _, want := range []string{"/home/user/a/b:dir", "/home/user/a/b/c:dir", "/home/user/a/b/c/nested.txt:file"} {
		if !strings.Contains(joined, want) {
			t.Errorf("list depth 3 lacks %s: %s", want, joined)
		}
	}
	var fi struct {
		Size int64
		Type string
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/files/mkdir", s.key, map[string]string{"path": "/home/user/new/dir"}, &fi); code != 200 || fi.Type != "dir" {
		t.Errorf("mkdir: %d %+v", code, fi)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/files/move", s.key, map[string]string{"from": "/home/user/one.bin", "to": "/home/user/new/dir/moved.bin"}, &fi); code != 200 {
		t.Errorf("move: %d", code)
	}
	if code := s.do("GET", "/v1/sandboxes/"+id+"/files/stat?path=/home/user/new/dir/moved.bin", s.key, nil, &fi); code != 200 || fi.Size != 1 || fi.Type != "file" {
		t.Errorf("stat moved: %d %+v", code, fi)
	}
	var e apiError
	if code := s.do("GET", "/v1/sandboxes/"+id+"/files/stat?path=/home/user/one.bin", s.key, nil, &e); code != 404 || e.Error != "not_found" {
		t.Errorf("stat of moved-away file: %d %+v", code, e)
	}
	if code := s.do("DELETE", "/v1/sandboxes/"+id+"/files?path=/home/user/a&recursive=true", s.key, nil, nil); code != 204 {
		t.Errorf("delete dir: %d", code)
	}
	if r := s.sh(id, "test -e /home/user/a && echo exists || echo gone"); r.Stdout != "gone\n" {
		t.Errorf("after delete: %q", r.Stdout)
	}
	// The sandbox may be a shared VM: its later checkpoints need not
	// carry 100 MB.
	s.sh(id, "rm -f /home/user/relative/100mb.bin")
}

func urlEscape(p string) string {
	var b strings.Builder
	for _, c := range []byte(p) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '/' || c == '.' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// TestReadPseudoFile: /proc files stat as empty but have content; reading
// one through the files API returns it.
func TestReadPseudoFile(t *testing.T) { forEachDriver(t, testReadPseudoFile) }

func testReadPseudoFile(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.sharedSandbox(t, drv)
	resp, err := s.get(id, "/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte("MemTotal")) {
		t.Errorf("/proc/meminfo: %d %q", resp.StatusCode, b)
	}
	// An empty regular file still reads as empty.
	s.put(id, "/home/user/empty", strings.NewReader(""))
	resp, _ = s.get(id, "/home/user/empty")
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(b) != 0 {
		t.Errorf("empty file: %d %q", resp.StatusCode, b)
	}
}

func TestMetrics(t *testing.T) { forEachDriver(t, testMetrics) }

// testMetrics: GET /v1/sandboxes/{id}/metrics reports the guest's use
// within the sandbox's limits; a written file shows in the disk use (under
// gVisor too, whose writable layer lives on the host); another team's key
// sees nothing; a paused sandbox answers a conflict naming its state.
func testMetrics(t *testing.T, drv string) {
	s := sharedServer(t)
	id := s.createOn(t, drv, map[string]any{"timeout_s": 600, "cpu": 1})
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	var sb struct {
		MemoryMB int `json:"memory_mb"`
	}
	s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb)
	type usage struct {
		Timestamp      time.Time `json:"timestamp"`
		CPUCount       int       `json:"cpu_count"`
		CPUUsedPct     float64   `json:"cpu_used_pct"`
		MemUsedBytes   int64     `json:"mem_used_bytes"`
		MemTotalBytes  int64     `json:"mem_total_bytes"`
		DiskUsedBytes  int64     `json:"disk_used_bytes"`
		DiskTotalBytes int64     `json:"disk_total_bytes"`
	}
	get := func() usage {
		t.Helper()
		var u usage
		if code := s.do("GET", "/v1/sandboxes/"+id+"/metrics", s.key, nil, &u); code != 200 {
			t.Fatalf("metrics: %d", code)
		}
		return u
	}
	u := get()
	if u.CPUCount != 1 || u.CPUUsedPct < 0 || u.CPUUsedPct > 100 || time.Since(u.Timestamp) > time.Minute {
		t.Errorf("cpu: %+v", u)
	}
	if u.MemTotalBytes <= 0 || u.MemTotalBytes > int64(sb.MemoryMB)<<20 || u.MemUsedBytes <= 0 || u.MemUsedBytes > u.MemTotalBytes {
		t.Errorf("memory (sandbox %d MB): %+v", sb.MemoryMB, u)
	}
	if u.DiskTotalBytes <= 0 || u.DiskUsedBytes < 0 {
		t.Errorf("disk: %+v", u)
	}
	if r := s.sh(id, "head -c 20000000 /dev/urandom > /home/user/blob && sync"); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	if after := get(); after.DiskUsedBytes < u.DiskUsedBytes+20000000 {
		t.Errorf("disk use after writing 20 MB: %d, before %d", after.DiskUsedBytes, u.DiskUsedBytes)
	}

	var e apiError
	other := s.teamKey("metrics-other-" + drv)
	if code := s.do("GET", "/v1/sandboxes/"+id+"/metrics", other, nil, &e); code != 404 || e.Error != "not_found" {
		t.Errorf("another team's key: %d %+v", code, e)
	}
	if code := s.do("GET", "/v1/sandboxes/sb-doesnotexist/metrics", s.key, nil, &e); code != 404 || e.Error != "not_found" {
		t.Errorf("unknown sandbox: %d %+v", code, e)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/pause", s.key, nil, nil); code != 200 {
		t.Fatalf("pause: %d", code)
	}
	if code := s.do("GET", "/v1/sandboxes/"+id+"/metrics", s.key, nil, &e); code != 409 || e.State != "paused" {
		t.Errorf("paused: %d %+v", code, e)
	}
}

// Deletes of one sandbox at once all succeed (a delete of a stopped
// sandbox is a no-op), and the sandbox ends stopped.
func TestConcurrentDeletes(t *testing.T) {
	s := sharedServer(t)
	id := s.create(nil)
	codes := make(chan int, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { codes <- s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil) })
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 204 {
			t.Errorf("a concurrent delete answered %d", code)
		}
	}
	var sb sandboxView
	if s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); sb.State != "stopped" {
		t.Errorf("after the deletes: %+v", sb)
	}
}
