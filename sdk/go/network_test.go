package space

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
	"time"
)

func TestCreateSandboxNetwork(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		want := map[string]any{
			"network": map[string]any{"allow": []any{"api.github.com", "*.pythonhosted.org:443"}, "deny": []any{"10.0.0.0/8"}},
			"secrets": []any{"GITHUB_TOKEN"},
		}
		if !reflect.DeepEqual(body, want) {
			t.Errorf("body = %v", body)
		}
		writeJSON(w, 201, map[string]any{"id": "sb1", "state": "running"})
	})
	_, err := c.CreateSandbox(t.Context(), CreateSandboxRequest{
		Network: &NetworkPolicy{Allow: []string{"api.github.com", "*.pythonhosted.org:443"}, Deny: []string{"10.0.0.0/8"}},
		Secrets: []string{"GITHUB_TOKEN"},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGetSetNetwork(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/sandboxes/sb1/network":
			writeJSON(w, 200, map[string]any{"allow": []string{"*"}, "deny": []string{}, "secrets": []string{"TOK"}})
		case "PUT /v1/sandboxes/sb1/network":
			var body map[string]any
			json.NewDecoder(r.Body).Decode(&body)
			// A nil Deny is sent as [] so the server clears it.
			if !reflect.DeepEqual(body, map[string]any{"allow": []any{"pypi.org"}, "deny": []any{}}) {
				t.Errorf("body = %v", body)
			}
			writeJSON(w, 200, map[string]any{"allow": []string{"pypi.org"}, "deny": []string{}, "secrets": []string{"TOK"}})
		case "GET /v1/sandboxes/nope/network":
			writeJSON(w, 404, map[string]any{"code": 404, "error": "not_found", "message": "sandbox nope not found"})
		default:
			t.Errorf("got %s %s", r.Method, r.URL.Path)
		}
	})
	n, err := c.GetNetwork(t.Context(), "sb1")
	if err != nil || !reflect.DeepEqual(*n, Network{Allow: []string{"*"}, Deny: []string{}, Secrets: []string{"TOK"}}) {
		t.Fatalf("get: %+v %v", n, err)
	}
	n, err = c.SetNetwork(t.Context(), "sb1", NetworkPolicy{Allow: []string{"pypi.org"}})
	if err != nil || !reflect.DeepEqual(n.Allow, []string{"pypi.org"}) {
		t.Fatalf("set: %+v %v", n, err)
	}
	if _, err := c.GetNetwork(t.Context(), "nope"); !IsNotFound(err) {
		t.Fatalf("missing sandbox: %v", err)
	}
}

func TestSecrets(t *testing.T) {
	var deleted string
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/secrets":
			writeJSON(w, 200, map[string]any{"secrets": []any{
				map[string]any{"name": "GITHUB_TOKEN", "hosts": []string{"api.github.com"}, "created_at": "2025-01-02T03:04:05Z"},
			}})
		case "DELETE /v1/secrets/GITHUB_TOKEN":
			deleted = "GITHUB_TOKEN"
			w.WriteHeader(204)
		case "DELETE /v1/secrets/NOPE":
			writeJSON(w, 404, map[string]any{"code": 404, "error": "not_found", "message": "secret NOPE not found"})
		default:
			t.Errorf("got %s %s", r.Method, r.URL.Path)
		}
	})
	got, err := c.ListSecrets(t.Context())
	want := []Secret{{Name: "GITHUB_TOKEN", Hosts: []string{"api.github.com"}, CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("list: %+v %v", got, err)
	}
	if err := c.DeleteSecret(t.Context(), "GITHUB_TOKEN"); err != nil || deleted != "GITHUB_TOKEN" {
		t.Fatalf("delete: %v", err)
	}
	if err := c.DeleteSecret(t.Context(), "NOPE"); !IsNotFound(err) {
		t.Fatalf("delete missing: %v", err)
	}
}
