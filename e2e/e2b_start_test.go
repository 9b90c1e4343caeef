package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestE2BBuildsInterpreterTemplateAtStart: on a fresh data dir, a server
// with the E2B API builds the code interpreter's template (python-data,
// E2B's code-interpreter-v1) at start, in the background, with progress
// in the log and in GET /v1/templates; an E2B create of it waits for the
// build (a 503 JSON error saying it still builds when that takes longer
// than the create waits) and then makes a sandbox of it. Nobody builds it
// by hand. A cache hit after the first run on a host.
func TestE2BBuildsInterpreterTemplateAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sandboxes")
	}
	addr := freeAddr(t)
	s := startServer(t, "", "--e2b-listen", addr, "--snapshot-interval", "-1")
	status := func() (string, string) {
		var list struct {
			Templates []struct{ Name, Status, Progress string }
		}
		if code := s.do("GET", "/v1/templates", s.key, nil, &list); code != 200 {
			t.Fatalf("GET /v1/templates: %d", code)
		}
		for _, tp := range list.Templates {
			if tp.Name == "python-data" {
				return tp.Status, tp.Progress
			}
		}
		t.Fatal("python-data not in GET /v1/templates")
		return "", ""
	}
	if st, _ := status(); st != "queued" && st != "building" && st != "ready" {
		t.Errorf("python-data at start: %q, want queued, building or ready (built at start)", st)
	}
	key := s.teamKey("e2b-start")
	url := "http://" + addr
	var made struct {
		SandboxID string `json:"sandboxID"`
	}
	refused := 0
	for deadline := time.Now().Add(20 * time.Minute); ; {
		req, _ := http.NewRequest("POST", url+"/sandboxes", strings.NewReader(`{"templateID":"code-interpreter-v1","timeout":300}`))
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 201 {
			if err := json.Unmarshal(body, &made); err != nil || made.SandboxID == "" {
				t.Fatalf("create: %s %v", body, err)
			}
			break
		}
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if resp.StatusCode != 503 || json.Unmarshal(body, &e) != nil || e.Code != 503 || !strings.Contains(e.Message, "still being built") {
			t.Fatalf("create while the template builds: %d %s, want 201 or a 503 JSON error saying it still builds", resp.StatusCode, body)
		}
		refused++
		st, line := status()
		t.Logf("create refused after its wait (%s); python-data is %s: %s", e.Message, st, line)
		if st != "queued" && st != "building" {
			t.Fatalf("refused as still building while the list says %q", st)
		}
		if time.Now().After(deadline) {
			t.Fatal("python-data not built in 20 min")
		}
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", url+"/sandboxes/"+made.SandboxID, nil)
		req.Header.Set("X-API-Key", key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	if st, _ := status(); st != "ready" {
		t.Errorf("python-data after the create: %q", st)
	}
	id := made.SandboxID
	if !strings.HasPrefix(id, "sb-") {
		id = "sb-" + id
	}
	if r := s.sh(id, "python3 -c 'import numpy, pandas; print(\"ok\")'"); strings.TrimSpace(r.Stdout) != "ok" {
		t.Errorf("the code interpreter's libraries in the sandbox: %+v", r)
	}
	logs := s.logText()
	for _, want := range []string{"building the E2B code interpreter's template", "E2B code interpreter template ready"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	t.Logf("created after %d refusals (each after the create's 50 s wait)", refused)
}
