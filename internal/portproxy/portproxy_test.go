package portproxy

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestServeStrips: the credential headers never reach the app, the headers
// the caller names are removed too, and the rest (the app's own
// Authorization among them) pass; the path given replaces the request's and
// the query is kept.
func TestServeStrips(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"path": r.URL.RequestURI(), "headers": r.Header, "host": r.Host})
	}))
	defer app.Close()
	var dialed []string
	p := New(func(ctx context.Context, id string, port int) (net.Conn, error) {
		dialed = append(dialed, id)
		return net.Dial("tcp", app.Listener.Addr().String())
	})
	defer p.Close()

	for _, tc := range []struct {
		strip    []string
		wantAuth string
	}{{nil, "Basic YXBwOnB3"}, {[]string{"Authorization"}, ""}} {
		req := httptest.NewRequest("GET", "http://api.example/v1/sandboxes/sb-1/ports/8000/a?b=c", nil)
		for _, h := range CredentialHeaders {
			req.Header.Set(h, "secret")
		}
		req.Header.Set("Authorization", "Basic YXBwOnB3")
		req.Header.Set("X-App", "kept")
		rec := httptest.NewRecorder()
		p.Serve(rec, req, "sb-1", 8000, "/a", tc.strip, func(w http.ResponseWriter, r *http.Request, err error) {
			t.Fatalf("proxy error: %v", err)
		})
		var got struct {
			Path    string
			Headers http.Header
			Host    string
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%d %q", rec.Code, rec.Body)
		}
		for _, h := range CredentialHeaders {
			if v := got.Headers.Get(h); v != "" {
				t.Errorf("%s reached the app: %q", h, v)
			}
		}
		if a := got.Headers.Get("Authorization"); a != tc.wantAuth {
			t.Errorf("strip %v: Authorization %q, want %q", tc.strip, a, tc.wantAuth)
		}
		if got.Headers.Get("X-App") != "kept" || got.Path != "/a?b=c" || got.Host != "api.example" || got.Headers.Get("X-Forwarded-Host") != "api.example" {
			t.Errorf("forwarded: %+v", got)
		}
	}
	if len(dialed) == 0 || dialed[0] != "sb-1" {
		t.Errorf("dialed %v", dialed)
	}
}

// TestServeKeepsEscapedPath: the app gets the path as the client escaped
// it (a%2Fb is one segment to a router that reads escaped paths); it got
// a/b.
func TestServeKeepsEscapedPath(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(r.URL.RequestURI()))
	}))
	defer app.Close()
	p := New(func(ctx context.Context, id string, port int) (net.Conn, error) {
		return net.Dial("tcp", app.Listener.Addr().String())
	})
	defer p.Close()
	for _, path := range []string{"/files/a%2Fb/c", "/x%20y", "/plain/path"} {
		req := httptest.NewRequest("GET", "http://api.example/v1/sandboxes/sb-1/ports/8000"+path+"?q=1", nil)
		rec := httptest.NewRecorder()
		p.Serve(rec, req, "sb-1", 8000, path, nil, func(w http.ResponseWriter, r *http.Request, err error) {
			t.Fatalf("proxy error: %v", err)
		})
		if got := rec.Body.String(); got != path+"?q=1" {
			t.Errorf("app saw %q, want %q", got, path+"?q=1")
		}
	}
}
