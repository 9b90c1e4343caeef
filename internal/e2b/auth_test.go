package e2b

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// TestE2BNoIDOracle: without a valid token, every per-sandbox route of the
// E2B listener (envd's port, /health included; the code interpreter's
// port; any other port of a private sandbox) answers the same 401 for a
// running sandbox, a stopped one and an id that does not exist: an
// unauthenticated /health used to say 204 for a live id and 502 for a
// missing one. With the sandbox's token the routes answer as before.
func TestE2BNoIDOracle(t *testing.T) {
	h, _, running := testHandler(t)
	const stopped, missing = "sb-stop234", "sb-none234"
	if err := h.cfg.Store.CreateSandbox(t.Context(), store.Sandbox{ID: stopped, Team: "t1", State: sandbox.StateStopped}); err != nil {
		t.Fatal(err)
	}
	do := func(id, port, method, path string, hdr map[string]string) (int, string) {
		r := httptest.NewRequest(method, path, nil)
		r.Header.Set("E2b-Sandbox-Id", e2bID(id))
		r.Header.Set("E2b-Sandbox-Port", port)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, strings.ReplaceAll(w.Body.String(), e2bID(id), "ID")
	}
	routes := []struct{ port, method, path string }{
		{"49983", "GET", "/health"},
		{"49983", "GET", "/files?path=/etc/hostname"},
		{"49983", "POST", "/process.Process/List"},
		{"49999", "GET", "/health"},
		{"49999", "GET", "/contexts"},
		{"8080", "GET", "/"},
	}
	for _, rt := range routes {
		for _, hdr := range []map[string]string{nil, {"X-Access-Token": h.accessToken("sb-other234"), "E2B-Traffic-Access-Token": h.trafficToken("sb-other234")}} {
			code, body := do(running, rt.port, rt.method, rt.path, hdr)
			if code != http.StatusUnauthorized {
				t.Errorf("%s %s on port %s of a running sandbox, token %v: %d %s, want 401", rt.method, rt.path, rt.port, hdr != nil, code, body)
			}
			for _, other := range []string{stopped, missing} {
				if c, b := do(other, rt.port, rt.method, rt.path, hdr); c != code || b != body {
					t.Errorf("%s %s on port %s: %s answers %d %s, a running sandbox %d %s", rt.method, rt.path, rt.port, other, c, b, code, body)
				}
			}
		}
	}
	// The owner, with the tokens: health answers, a gone sandbox is 502.
	if code, body := do(running, "49983", "GET", "/health", map[string]string{"X-Access-Token": h.accessToken(running)}); code != http.StatusNoContent {
		t.Errorf("envd /health with the token: %d %s", code, body)
	}
	if code, body := do(running, "49999", "GET", "/health", map[string]string{"E2B-Traffic-Access-Token": h.trafficToken(running)}); code != http.StatusOK {
		t.Errorf("interpreter /health with the traffic token: %d %s", code, body)
	}
	if code, body := do(stopped, "49983", "GET", "/health", map[string]string{"X-Access-Token": h.accessToken(stopped)}); code != http.StatusBadGateway {
		t.Errorf("envd /health of a stopped sandbox with its token: %d %s", code, body)
	}
}
