package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	space "github.com/spacesandbox/space/sdk/go"
)

// portServer is a small HTTP server for the sandbox: /headers answers the
// request's headers as JSON, /echo its body, /upgrade switches to a raw
// echo protocol (what a WebSocket does at the HTTP level), anything else
// the path and query.
const portServer = `
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, body, ctype="text/plain"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/headers":
            return self.reply(json.dumps(dict(self.headers)).encode(), "application/json")
        if self.path == "/upgrade":
            self.send_response(101)
            self.send_header("Upgrade", "echo")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            while True:
                b = self.connection.recv(65536)
                if not b:
                    return
                self.connection.sendall(b)
        self.reply(("path=" + self.path).encode())
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.reply(self.rfile.read(n), "application/octet-stream")
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// startPortServer runs portServer on port in sandbox id, waits until it
// answers through the proxy and returns its pid.
func startPortServer(t *testing.T, s *server, key, id string, port int) int {
	t.Helper()
	if code := s.do("PUT", "/v1/sandboxes/"+id+"/files?path=/tmp/srv.py", key, []byte(portServer), nil); code != 200 {
		t.Fatalf("write server: %d", code)
	}
	var res struct {
		PID int `json:"pid"`
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", key, map[string]any{"cmd": []string{"python3", "/tmp/srv.py", fmt.Sprint(port)}, "background": true}, &res); code != 202 {
		t.Fatalf("start server: %d", code)
	}
	waitFor(t, "the server in the sandbox", 60*time.Second, func() bool {
		return s.do("GET", fmt.Sprintf("/v1/sandboxes/%s/ports/%d/ready", id, port), key, nil, nil) == 200
	})
	return res.PID
}

// TestPortsDrivers: the way in works the same on every driver (it is the
// agent's, over each driver's transport).
func TestPortsDrivers(t *testing.T) {
	s := sharedServer(t)
	forEachDriver(t, func(t *testing.T, drv string) {
		id := s.sharedSandbox(t, drv)
		pid := startPortServer(t, s, s.key, id, 8100)
		defer s.do("POST", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/signal", id, pid), s.key, map[string]string{"signal": "SIGKILL"}, nil)
		code, body := httpGet(t, s.url+"/v1/sandboxes/"+id+"/ports/8100/"+drv+"?ok=1", "", http.Header{"Authorization": {"Bearer " + s.key}})
		if code != 200 || body != "path=/"+drv+"?ok=1" {
			t.Errorf("GET through the port on %s: %d %q", drv, code, body)
		}
	})
}

// httpGet GETs url with the non-empty headers of hdr (and Host host, if
// set) and returns the status and body.
func httpGet(t *testing.T, url, host string, hdr http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if host != "" {
		req.Host = host
	}
	for k, vs := range hdr {
		for _, v := range vs {
			if v != "" {
				req.Header.Add(k, v)
			}
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPorts: /v1/sandboxes/{id}/ports/{port}/… reaches a server in the
// sandbox (which has no network) through its agent: paths, queries,
// bodies of any size, upgraded connections; the API key is not passed on;
// other teams, closed ports and the agent's own egress port are refused.
func TestPorts(t *testing.T) {
	s := sharedServer(t)
	key := s.teamKey("ports")
	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{"network": map[string]any{"allow": []string{"example.test"}}}, &sb); code != 201 {
		t.Fatalf("create: %d", code)
	}
	defer s.do("DELETE", "/v1/sandboxes/"+sb.ID, key, nil, nil)
	base := s.url + "/v1/sandboxes/" + sb.ID + "/ports/8000"
	startPortServer(t, s, key, sb.ID, 8000)

	get := func(url, k string) (int, string) {
		t.Helper()
		h := http.Header{}
		if k != "" {
			h.Set("Authorization", "Bearer "+k)
		}
		return httpGet(t, url, "", h)
	}
	if code, body := get(base+"/a/b?x=1&y=%20z", key); code != 200 || body != "path=/a/b?x=1&y=%20z" {
		t.Errorf("GET through the port: %d %q", code, body)
	}
	// Escaped as the client sent it: a%2Fb is one segment to the app.
	if code, body := get(base+"/files/a%2Fb?x=1", key); code != 200 || body != "path=/files/a%2Fb?x=1" {
		t.Errorf("GET of an escaped path through the port: %d %q", code, body)
	}
	if code, body := get(base, key); code != 200 || body != "path=/" {
		t.Errorf("GET of the port's root: %d %q", code, body)
	}
	code, body := get(base+"/headers", key)
	var hdr map[string]string
	if code != 200 || json.Unmarshal([]byte(body), &hdr) != nil {
		t.Fatalf("headers: %d %q", code, body)
	}
	for k := range hdr {
		if strings.EqualFold(k, "Authorization") {
			t.Errorf("the API key reached the sandbox: %v", hdr)
		}
	}
	if !strings.HasPrefix(hdr["X-Forwarded-For"], "127.0.0.1") || hdr["Host"] == "" {
		t.Errorf("forwarded headers: %v", hdr)
	}
	// With the key as X-API-Key, Authorization is the app's (basic auth, a
	// notebook's token) and reaches it; the key does not, nor does an
	// Authorization that carries the key after all.
	appAuth := "Basic YXBwOnB3"
	for _, tc := range []struct {
		auth, want string
	}{{appAuth, appAuth}, {"Bearer " + key, ""}} {
		code, body := httpGet(t, base+"/headers", "", http.Header{"X-Api-Key": {key}, "Authorization": {tc.auth}})
		hdr := map[string]string{}
		if code != 200 || json.Unmarshal([]byte(body), &hdr) != nil {
			t.Fatalf("headers with X-API-Key: %d %q", code, body)
		}
		if hdr["Authorization"] != tc.want || strings.Contains(body, key) {
			t.Errorf("with X-API-Key and Authorization %q the sandbox saw %v, want Authorization %q and no key", tc.auth, hdr, tc.want)
		}
	}
	if code, _ := httpGet(t, base+"/headers", "", http.Header{"X-Api-Key": {"wrong"}, "Authorization": {"Bearer " + key}}); code != 401 {
		t.Errorf("a wrong X-API-Key with a right Bearer token: %d, want 401 (X-API-Key is the key when it is set)", code)
	}
	if code, _ := httpGet(t, s.url+"/v1/sandboxes/"+sb.ID, "", http.Header{"X-Api-Key": {key}}); code != 200 {
		t.Errorf("GET the sandbox with X-API-Key: %d", code)
	}

	// The Go SDK's transport: any HTTP client talks to the port.
	hc := &http.Client{Transport: space.NewClient(s.url, key).PortTransport(sb.ID, 8000)}
	if resp, err := hc.Get("http://sandbox.invalid/sdk?q=1"); err != nil {
		t.Errorf("through the SDK's transport: %v", err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "path=/sdk?q=1" {
			t.Errorf("through the SDK's transport: %d %q", resp.StatusCode, b)
		}
	}

	// space forward: a local address for the port, no key needed there.
	local := freeAddr(t)
	fwd := exec.Command(spaceBin(t), "forward", sb.ID, "8000", "--listen", local)
	fwd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+key)
	fwdOut, _ := fwd.StdoutPipe()
	if err := fwd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(fwdOut).ReadString('\n'); err != nil || !strings.Contains(line, "forwarding http://"+local) {
		t.Fatalf("space forward: %q %v", line, err)
	}
	if code, body := httpGet(t, "http://"+local+"/fwd?a=b", "", nil); code != 200 || body != "path=/fwd?a=b" {
		t.Errorf("through space forward: %d %q", code, body)
	}
	if code, body := httpGet(t, "http://"+local+"/headers", "", http.Header{"Authorization": {appAuth}}); code != 200 ||
		!strings.Contains(body, `"Authorization": "`+appAuth+`"`) || strings.Contains(body, key) {
		t.Errorf("a browser's basic auth through space forward: %d %q", code, body)
	}
	fwd.Process.Signal(os.Interrupt)
	if err := fwd.Wait(); err != nil {
		t.Errorf("space forward after Ctrl-C: %v", err)
	}

	// 8 MiB up and back, byte for byte.
	blob := make([]byte, 8<<20)
	rand.Read(blob)
	req, _ := http.NewRequest("POST", base+"/echo", bytes.NewReader(blob))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, blob) {
		t.Errorf("8 MiB echo: %d, %d bytes back, equal %v", resp.StatusCode, len(got), bytes.Equal(got, blob))
	}

	// An upgraded connection carries bytes both ways until closed.
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/sandboxes/%s/ports/8000/upgrade HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", sb.ID, key)
	br := bufio.NewReader(conn)
	uresp, err := http.ReadResponse(br, nil)
	if err != nil || uresp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %+v", err, uresp)
	}
	for _, msg := range []string{"ping", strings.Repeat("x", 100000)} {
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatal(err)
		}
		back := make([]byte, len(msg))
		if _, err := io.ReadFull(br, back); err != nil || string(back) != msg {
			t.Fatalf("echo over the upgraded connection: %v (%d bytes)", err, len(msg))
		}
	}
	conn.Close()

	// public_ports is a create option the record keeps (it opens the E2B
	// host names; TestE2BPorts), and the /v1 path still needs the key.
	var pub struct {
		ID          string `json:"id"`
		PublicPorts bool   `json:"public_ports"`
	}
	if code := s.do("POST", "/v1/sandboxes", key, map[string]any{"public_ports": true}, &pub); code != 201 || !pub.PublicPorts {
		t.Errorf("create with public_ports: %d %+v", code, pub)
	}
	if pub.ID != "" {
		defer s.do("DELETE", "/v1/sandboxes/"+pub.ID, key, nil, nil)
		if code, _ := get(s.url+"/v1/sandboxes/"+pub.ID+"/ports/8000/", ""); code != 401 {
			t.Errorf("the /v1 port path of a public sandbox without a key: %d", code)
		}
	}

	// Refusals, as JSON errors.
	var e apiError
	if code := s.do("GET", "/v1/sandboxes/"+sb.ID+"/ports/8001/", key, nil, &e); code != 503 || !strings.Contains(e.Message, "nothing listens on port 8001") {
		t.Errorf("closed port: %d %+v", code, e)
	}
	if code := s.do("GET", "/v1/sandboxes/"+sb.ID+"/ports/3128/", key, nil, &e); code != 403 || e.Error != "permission_denied" {
		t.Errorf("the agent's egress port: %d %+v", code, e)
	}
	if code := s.do("GET", "/v1/sandboxes/"+sb.ID+"/ports/0/", key, nil, &e); code != 400 {
		t.Errorf("port 0: %d %+v", code, e)
	}
	if code := s.do("GET", "/v1/sandboxes/"+sb.ID+"/ports/8000/", s.teamKey("ports-other"), nil, &e); code != 404 {
		t.Errorf("another team: %d %+v", code, e)
	}
	if code, _ := get(base+"/", ""); code != 401 {
		t.Errorf("no key: %d", code)
	}
	// A paused sandbox is not reached (and a kept-alive connection to it
	// is not reused).
	if code := s.do("POST", "/v1/sandboxes/"+sb.ID+"/pause", key, nil, nil); code != 200 {
		t.Fatalf("pause: %d", code)
	}
	if code := s.do("GET", "/v1/sandboxes/"+sb.ID+"/ports/8000/", key, nil, &e); code != 409 {
		t.Errorf("paused sandbox: %d %+v", code, e)
	}
	if code := s.do("POST", "/v1/sandboxes/"+sb.ID+"/resume", key, nil, nil); code != 200 {
		t.Fatalf("resume: %d", code)
	}
	waitFor(t, "the port after resume", 30*time.Second, func() bool {
		c, _ := get(base+"/again", key)
		return c == 200
	})
}
