package e2b

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/agentproto"
)

func TestRoute(t *testing.T) {
	for _, tc := range []struct {
		host, id, port string
		wantID         string
		wantPort       int
		ok             bool
	}{
		{host: "127.0.0.1:3000", id: "abc", port: "49983", wantID: "sb-abc", wantPort: 49983, ok: true},
		{host: "127.0.0.1:3000", id: "abc", port: "49999", wantID: "sb-abc", wantPort: 49999, ok: true},
		{host: "127.0.0.1:3000", id: "abc", wantID: "sb-abc", wantPort: 49983, ok: true},
		{host: "49983-xyz234.sandbox.example.com", wantID: "sb-xyz234", wantPort: 49983, ok: true},
		{host: "8080-xyz.example.com:443", wantID: "sb-xyz", wantPort: 8080, ok: true},
		{host: "api.example.com"},
		{host: "127.0.0.1:3000"},
		{host: "localhost"},
	} {
		r := httptest.NewRequest("GET", "http://"+tc.host+"/health", nil)
		r.Host = tc.host
		if tc.id != "" {
			r.Header.Set("E2b-Sandbox-Id", tc.id)
		}
		if tc.port != "" {
			r.Header.Set("E2b-Sandbox-Port", tc.port)
		}
		id, port, ok := route(r)
		if ok != tc.ok || id != tc.wantID || port != tc.wantPort {
			t.Errorf("route(%s, %q, %q) = %q %d %v, want %q %d %v", tc.host, tc.id, tc.port, id, port, ok, tc.wantID, tc.wantPort, tc.ok)
		}
	}
}

func TestIDs(t *testing.T) {
	if e2bID("sb-abc") != "abc" || spaceID("abc") != "sb-abc" || spaceID("sb-abc") != "sb-abc" {
		t.Fatal("id mapping")
	}
}

// The SDK encodes metadata three times: {a: "b c"} → metadata=a%3Db%252520c.
func TestListQueryMetadata(t *testing.T) {
	q, err := url.ParseQuery("metadata=a%3Db%252520c%26k%3Dv&state=running,paused&limit=5&order=desc")
	if err != nil {
		t.Fatal(err)
	}
	lq, err := parseListQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	if lq.metadata["a"] != "b c" || lq.metadata["k"] != "v" {
		t.Errorf("metadata = %v", lq.metadata)
	}
	if lq.limit != 5 || !lq.desc || len(lq.states) != 3 {
		t.Errorf("query = %+v", lq)
	}
	if _, err := parseListQuery(url.Values{"state": {"stopped"}}); err == nil {
		t.Error("state=stopped accepted")
	}
}

func TestSignature(t *testing.T) {
	h := &Handler{tokenKey: []byte("k")}
	tok := "tok"
	sum := sha256.Sum256([]byte("/tmp/a.txt:read::" + tok))
	sig := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	r := httptest.NewRequest("GET", "/files?path=/tmp/a.txt&signature="+url.QueryEscape(sig), nil)
	if !h.validSignature(r, tok) {
		t.Error("valid signature refused")
	}
	r = httptest.NewRequest("POST", "/files?path=/tmp/a.txt&signature="+url.QueryEscape(sig), nil)
	if h.validSignature(r, tok) {
		t.Error("read signature accepted for a write")
	}
	r = httptest.NewRequest("GET", "/files?path=/tmp/a.txt&signature_expiration=1&signature="+url.QueryEscape(sig), nil)
	if h.validSignature(r, tok) {
		t.Error("expired signature accepted")
	}
}

func TestEndEvent(t *testing.T) {
	one, zero := 1, 0
	if e := endEvent(agentproto.Event{ExitCode: &zero}); e.ExitCode != 0 || e.Error != nil || e.Status != "exit status 0" {
		t.Errorf("exit 0: %+v", e)
	}
	if e := endEvent(agentproto.Event{ExitCode: &one}); e.ExitCode != 1 || e.GetError() != "exit status 1" {
		t.Errorf("exit 1: %+v", e)
	}
	if e := endEvent(agentproto.Event{Signal: "SIGKILL"}); e.ExitCode != -1 || e.Status != "signal: killed" || e.Exited {
		t.Errorf("killed: %+v", e)
	}
}

func TestNetworkSpec(t *testing.T) {
	no := false
	if networkSpec(&no, nil, nil) != nil {
		t.Error("allow_internet_access:false gave a network")
	}
	if s := networkSpec(nil, nil, nil); s == nil || s.Allow[0] != "*" {
		t.Errorf("default = %+v, want internet", s)
	}
	if s := networkSpec(&no, []string{"example.com"}, []string{"bad.com"}); s == nil || s.Allow[0] != "example.com" || s.Deny[0] != "bad.com" {
		t.Errorf("allow list = %+v", s)
	}
}
