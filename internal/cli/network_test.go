package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// netServer implements the network, egress and secret endpoints the way the
// real server does, for sandbox sb_1. Request bodies are recorded in bodies
// by "METHOD path".
func netServer(t *testing.T, bodies map[string]map[string]any) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer admin-key" {
				writeErr(w, 401, "unauthenticated", "missing or invalid API key")
				return
			}
			if r.Method == "POST" || r.Method == "PUT" {
				var body map[string]any
				json.NewDecoder(r.Body).Decode(&body)
				bodies[r.Method+" "+r.URL.Path] = body
			}
			if r.PathValue("id") != "" && r.PathValue("id") != "sb_1" {
				writeErr(w, 404, "not_found", "sandbox "+r.PathValue("id")+" not found")
				return
			}
			h(w, r)
		}
	}
	mux.HandleFunc("POST /v1/sandboxes", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 201, map[string]any{"id": "sb_9", "state": "running"})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/network", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"allow": []string{"api.github.com", "*.pythonhosted.org:443"}, "deny": []string{"10.0.0.0/8"}, "secrets": []string{"GITHUB_TOKEN"}})
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", auth(func(w http.ResponseWriter, r *http.Request) {
		b := bodies["PUT "+r.URL.Path]
		writeJSON(w, 200, map[string]any{"allow": b["allow"], "deny": b["deny"], "secrets": []string{"GITHUB_TOKEN"}})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/egress", auth(func(w http.ResponseWriter, r *http.Request) {
		recs := []any{
			map[string]any{"time": "2025-01-02T03:04:05Z", "sandbox_id": "sb_1", "host": "api.github.com", "ip": "140.82.112.6", "port": 443,
				"sni": "api.github.com", "method": "GET", "decision": "allow", "rule": "api.github.com", "bytes_up": 512, "bytes_down": 4096,
				"secret": "GITHUB_TOKEN", "duration": 1500000000},
			map[string]any{"time": "2025-01-02T03:04:06Z", "sandbox_id": "sb_1", "host": "evil.example", "port": 80,
				"decision": "deny", "reason": "not_allowed", "bytes_up": 0, "bytes_down": 0, "duration": 0},
		}
		if r.URL.Query().Get("limit") == "1" {
			recs = recs[1:]
		}
		writeJSON(w, 200, map[string]any{"records": recs})
	}))
	mux.HandleFunc("POST /v1/secrets", auth(func(w http.ResponseWriter, r *http.Request) {
		b := bodies["POST /v1/secrets"]
		writeJSON(w, 201, map[string]any{"name": b["name"], "hosts": b["hosts"], "created_at": "2025-01-02T03:04:05Z"})
	}))
	mux.HandleFunc("GET /v1/secrets", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"secrets": []any{
			map[string]any{"name": "GITHUB_TOKEN", "hosts": []string{"api.github.com", "*.githubusercontent.com"}, "created_at": "2025-01-02T03:04:05Z"},
		}})
	}))
	mux.HandleFunc("DELETE /v1/secrets/{name}", auth(func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "GITHUB_TOKEN" {
			writeErr(w, 404, "not_found", "secret "+r.PathValue("name")+" not found")
			return
		}
		w.WriteHeader(204)
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestCLINetworkVerbs(t *testing.T) {
	bodies := map[string]map[string]any{}
	srv := netServer(t, bodies)
	const secret = "s3cr3t-never-echoed"
	tests := []struct {
		name      string
		stdin     string
		args      []string
		code      int
		out, errs string         // errs: a prefix of stderr
		path      string         // request whose body is checked
		body      map[string]any // expected body of path
	}{
		{"create with network", "", []string{"create", "--allow", "api.github.com,*.pythonhosted.org:443", "--allow", "pypi.org", "--deny", "10.0.0.0/8", "--secret", "A,B", "--secret", "C"},
			0, "sb_9\n", "", "POST /v1/sandboxes", map[string]any{
				"network": map[string]any{"allow": []any{"api.github.com", "*.pythonhosted.org:443", "pypi.org"}, "deny": []any{"10.0.0.0/8"}},
				"secrets": []any{"A", "B", "C"}}},
		{"create without network", "", []string{"create"}, 0, "sb_9\n", "", "POST /v1/sandboxes", map[string]any{}},
		{"create deny only", "", []string{"create", "--deny", "1.2.3.4/32"}, 0, "sb_9\n", "", "POST /v1/sandboxes",
			map[string]any{"network": map[string]any{"allow": []any{}, "deny": []any{"1.2.3.4/32"}}}},
		{"network show", "", []string{"network", "sb_1"}, 0,
			"allow:   api.github.com, *.pythonhosted.org:443\ndeny:    10.0.0.0/8\nsecrets: GITHUB_TOKEN\n", "", "", nil},
		{"network set allow keeps deny", "", []string{"network", "sb_1", "--allow", "*"}, 0,
			"allow:   *\ndeny:    10.0.0.0/8\nsecrets: GITHUB_TOKEN\n", "",
			"PUT /v1/sandboxes/sb_1/network", map[string]any{"allow": []any{"*"}, "deny": []any{"10.0.0.0/8"}}},
		{"network clear", "", []string{"network", "sb_1", "--allow", "", "--deny", ""}, 0,
			"allow:   - (no network)\ndeny:    -\nsecrets: GITHUB_TOKEN\n", "",
			"PUT /v1/sandboxes/sb_1/network", map[string]any{"allow": []any{}, "deny": []any{}}},
		{"network missing", "", []string{"network", "sb_x"}, 1, "", "space: sandbox sb_x not found\n", "", nil},
		{"egress", "", []string{"egress", "sb_1"}, 0,
			"TIME                 DECISION  DESTINATION         SNI             RULE/REASON     UP    DOWN    SECRET\n" +
				fmtTime(mustTime("2025-01-02T03:04:05Z")) + "  allow     api.github.com:443  api.github.com  api.github.com  512B  4.0KiB  GITHUB_TOKEN\n" +
				fmtTime(mustTime("2025-01-02T03:04:06Z")) + "  deny      evil.example:80     -               not_allowed     0B    0B      -\n", "", "", nil},
		{"egress missing", "", []string{"egress", "sb_x"}, 1, "", "space: sandbox sb_x not found\n", "", nil},
		{"secret set header", secret + "\n", []string{"secret", "set", "GITHUB_TOKEN", "--hosts", "api.github.com,*.githubusercontent.com",
			"--header", "Authorization", "--format", "Bearer {value}"}, 0,
			"secret GITHUB_TOKEN stored for api.github.com, *.githubusercontent.com\n", "", "POST /v1/secrets", map[string]any{
				"name": "GITHUB_TOKEN", "value": secret, "hosts": []any{"api.github.com", "*.githubusercontent.com"},
				"inject": map[string]any{"header": "Authorization", "format": "Bearer {value}"}}},
		{"secret set basic auth", secret, []string{"secret", "set", "PYPI", "--hosts", "upload.pypi.org", "--basic-auth-user", "__token__"}, 0,
			"secret PYPI stored for upload.pypi.org\n", "", "POST /v1/secrets", map[string]any{
				"name": "PYPI", "value": secret, "hosts": []any{"upload.pypi.org"},
				"inject": map[string]any{"basic_auth": map[string]any{"user": "__token__"}}}},
		{"secret set query", secret + "\r\n", []string{"secret", "set", "MAPS", "--hosts", "maps.example", "--query-param", "key"}, 0,
			"secret MAPS stored for maps.example\n", "", "POST /v1/secrets", map[string]any{
				"name": "MAPS", "value": secret, "hosts": []any{"maps.example"}, "inject": map[string]any{"query_param": "key"}}},
		{"secret set empty", "\n", []string{"secret", "set", "X", "--hosts", "a.example", "--header", "X-Key"}, 1, "", "space: empty secret value", "", nil},
		{"secret set no hosts", secret, []string{"secret", "set", "X", "--header", "X-Key"}, 1, "", "space: --hosts is required", "", nil},
		{"secret set two modes", secret, []string{"secret", "set", "X", "--hosts", "a.example", "--header", "X-Key", "--query-param", "k"}, 1, "",
			"space: give exactly one of --header", "", nil},
		{"secret set no mode", secret, []string{"secret", "set", "X", "--hosts", "a.example"}, 1, "", "space: give exactly one of --header", "", nil},
		{"secret set format without header", secret, []string{"secret", "set", "X", "--hosts", "a.example", "--format", "{value}", "--query-param", "k"}, 1, "",
			"space: --format needs --header", "", nil},
		{"secret list", "", []string{"secret", "list"}, 0,
			"NAME          HOSTS                                    CREATED\nGITHUB_TOKEN  api.github.com, *.githubusercontent.com  " +
				fmtTime(mustTime("2025-01-02T03:04:05Z")) + "\n", "", "", nil},
		{"secret rm", "", []string{"secret", "rm", "GITHUB_TOKEN", "NOPE"}, 1, "", "space: NOPE: secret NOPE not found\n", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clear(bodies)
			code, out, errOut := runCLI(t, srv, tt.stdin, tt.args...)
			if code != tt.code || out != tt.out || !strings.HasPrefix(errOut, tt.errs) || (tt.errs == "" && errOut != "") {
				t.Fatalf("code %d stdout %q stderr %q; want %d %q %q", code, out, errOut, tt.code, tt.out, tt.errs)
			}
			if strings.Contains(out+errOut, secret) {
				t.Fatalf("the secret value was printed: %q %q", out, errOut)
			}
			if tt.path != "" && !reflect.DeepEqual(bodies[tt.path], tt.body) {
				t.Fatalf("%s body = %v, want %v", tt.path, bodies[tt.path], tt.body)
			}
		})
	}
}

func TestCLIEgressJSON(t *testing.T) {
	srv := netServer(t, map[string]map[string]any{})
	code, out, errOut := runCLI(t, srv, "", "egress", "sb_1", "--limit", "1", "--json")
	if code != 0 || errOut != "" {
		t.Fatalf("code %d stderr %q", code, errOut)
	}
	var recs []map[string]any
	if err := json.Unmarshal([]byte(out), &recs); err != nil || len(recs) != 1 || recs[0]["host"] != "evil.example" || recs[0]["decision"] != "deny" {
		t.Fatalf("records %v (%v) from %q", recs, err, out)
	}
}

func TestSplitList(t *testing.T) {
	got := splitList([]string{"a, b", "", "c,,", " d "})
	if !reflect.DeepEqual(got, []string{"a", "b", "c", "d"}) {
		t.Fatalf("got %q", got)
	}
}

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}
